"""What tests and benchmarks both drive: serving clients, conv nets, the export matrix's exports.

Not part of the product: the metainfer wheel does not contain it. ``make venv``
installs it in editable mode (testkit/pyproject.toml). tests/ and bench/ both
import it, so neither is the other's fixture library:

- ``testkit.serve_attacks``: the raw clients that once took ``metainfer serve`` out;
- ``testkit.serve_chaos``: every client at once, seeded;
- ``testkit.exports``: all-MiniLM-L6-v2 written by the exporters users run;
- ``testkit.cnn_models``: the conv nets of the CNN matrix and their images;
- ``testkit.peer_env``: the virtual environments those exporters (and bench/'s
  other peers) run in, built from the locks in bench/.
"""
