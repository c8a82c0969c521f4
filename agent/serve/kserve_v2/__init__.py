"""The KServe v2 gRPC protocol definition and the descriptor set compiled from it: data that
``metainfer.agent.serve.grpc_messages`` loads (a package so that setuptools ships it as package data)."""
