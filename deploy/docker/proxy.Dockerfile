# syntax=docker/dockerfile:1
# csi-scsi-proxy, the controller plugin. Build from the repository root:
#   docker build -f deploy/docker/proxy.Dockerfile -t csi-scsi/proxy:dev .
# (BuildKit reads proxy.Dockerfile.dockerignore beside this file.)
FROM rust:1.90-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p csi-scsi-proxy --bin csi-scsi-proxy \
    && install -D target/release/csi-scsi-proxy /out/csi-scsi-proxy

# glibc only: no shell, no package manager. The proxy needs no host tools.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/csi-scsi-proxy /usr/local/bin/csi-scsi-proxy
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/csi-scsi-proxy"]
