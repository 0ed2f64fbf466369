# syntax=docker/dockerfile:1
# csi-scsi-agent, the node plugin. Build from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t csi-scsi/agent:dev .
# (BuildKit reads agent.Dockerfile.dockerignore beside this file.)
FROM rust:1.90-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p csi-scsi-agent --bin csi-scsi-agent \
    && install -D target/release/csi-scsi-agent /out/csi-scsi-agent

# The host tools the agent drives: filesystems, mounts, the iSCSI
# initiator's iscsiadm, multipath, SCSI utilities. iscsid and multipathd
# run on the host; the agent reaches them through the host network
# namespace (hostNetwork in the DaemonSet).
FROM debian:12-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       e2fsprogs xfsprogs util-linux mount kmod udev open-iscsi multipath-tools sg3-utils \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/csi-scsi-agent /usr/local/bin/csi-scsi-agent
ENTRYPOINT ["/usr/local/bin/csi-scsi-agent"]
