"""The wire contract: generated protobuf/gRPC stubs (``scripts/gen-proto``), the codec, channel settings."""
