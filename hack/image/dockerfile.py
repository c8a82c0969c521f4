"""Read the Dockerfile's runtime stage, so the registry-less build follows the same instructions.

The Dockerfile is the documented build for users with a registry; ``make image``
executes the instructions of its last stage itself (in a chroot over a locally
made Debian root filesystem) instead of a copy of them. Only what that stage
uses is understood: ARG, ENV, RUN (with bind mounts, which the local build
provides by their target), USER, WORKDIR, EXPOSE, ENTRYPOINT, CMD; anything else
is an error that names the instruction, so a Dockerfile change cannot silently
diverge from the local build.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


class DockerfileError(ValueError):
    pass


@dataclass(frozen=True)
class Run:
    """One RUN instruction: the environment it sees, its shell script, and the targets of its bind mounts."""

    env: dict[str, str]
    script: str
    mounts: tuple[str, ...] = ()


@dataclass
class RuntimeStage:
    """The last stage of the Dockerfile, with ARG and ENV values expanded in order."""

    base_image: str
    env: dict[str, str] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    user: str = ""
    workdir: str = ""
    exposed_ports: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        lines.append((current + raw).strip())
        current = ""
    if current:
        lines.append(current.strip())
    return lines


def _expand(value: str, variables: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, value)


def _env_pairs(rest: str, variables: dict[str, str]) -> dict[str, str]:
    tokens = shlex.split(rest)
    if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
        return {tokens[0]: _expand(" ".join(tokens[1:]), variables)}
    pairs = {}
    for token in tokens:
        key, _, value = token.partition("=")
        pairs[key] = _expand(value, {**variables, **pairs})
    return pairs


def _run(path: Path, rest: str, variables: dict[str, str]) -> Run:
    """A RUN's flags and script; only bind mounts are understood (the local build provides them by target)."""
    flags = re.match(r"^((?:--\S+\s+)*)(.*)$", rest, re.S)
    assert flags is not None  # the pattern matches any text
    mounts: list[str] = []
    for flag in flags[1].split():
        name, _, value = flag.partition("=")
        options = dict(option.partition("=")[::2] for option in value.split(",")) if name == "--mount" else {}
        if name != "--mount" or options.get("type") != "bind" or not options.get("target"):
            raise DockerfileError(f"{path}: RUN {flag}: only --mount=type=bind,...,target=DIR is understood")
        mounts.append(options["target"])
    return Run(dict(variables), flags[2], tuple(mounts))


def parse(path: Path, build_args: dict[str, str] | None = None, base_env: dict[str, str] | None = None) -> RuntimeStage:
    """The last stage of ``path``; ``build_args`` override ARG defaults as ``--build-arg`` would.

    ``base_env`` is the base image's environment (its PATH, which ``ENV PATH=...:$PATH`` extends).
    An ARG with neither a default nor a build arg stays unset, as in Docker.
    """
    build_args = build_args or {}
    lines = [
        (ins.upper(), rest.strip())
        for ins, _, rest in (line.partition(" ") for line in _logical_lines(path.read_text()))
    ]
    froms = [i for i, (ins, _) in enumerate(lines) if ins == "FROM"]
    if not froms:
        raise DockerfileError(f"{path} has no FROM")
    global_args: dict[str, str] = {}
    for instruction, rest in lines[: froms[0]]:
        if instruction != "ARG":
            raise DockerfileError(f"{path}: {instruction} before the first FROM")
        name, _, default = rest.partition("=")
        global_args[name] = build_args.get(name, _expand(default, global_args))
    stage = RuntimeStage(base_image=_expand(lines[froms[-1]][1].split()[0], global_args), env=dict(base_env or {}))
    for instruction, rest in lines[froms[-1] + 1 :]:
        variables = {**stage.args, **stage.env}
        if instruction == "ARG":
            # A stage's ARG without a default takes the global one (Docker's scoping rule).
            name, _, default = rest.partition("=")
            fallback = _expand(default, variables) if default else global_args.get(name)
            value = build_args.get(name, fallback)
            if value is not None:
                stage.args[name] = value
        elif instruction == "ENV":
            stage.env.update(_env_pairs(rest, variables))
        elif instruction == "RUN":
            stage.runs.append(_run(path, rest, variables))
        elif instruction == "USER":
            stage.user = _expand(rest, variables)
        elif instruction == "WORKDIR":
            stage.workdir = _expand(rest, variables)
        elif instruction == "EXPOSE":
            stage.exposed_ports += [p if "/" in p else f"{p}/tcp" for p in rest.split()]
        elif instruction in {"ENTRYPOINT", "CMD"}:
            try:
                value = json.loads(rest)
            except json.JSONDecodeError as exc:
                raise DockerfileError(f"{path}: {instruction} must be in exec (JSON) form") from exc
            setattr(stage, instruction.lower(), [str(v) for v in value])
        else:
            raise DockerfileError(f"{path}: {instruction} in the runtime stage is not understood by make image")
    return stage
