# syntax=docker/dockerfile:1
# Multi-stage build of the operator binary.
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends pkg-config libssl-dev libvirt-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG EPO_GIT_COMMIT=unknown
ENV EPO_GIT_COMMIT=${EPO_GIT_COMMIT}
RUN cargo build --release --locked -p egress-proxies-operator

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libvirt0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/egress-proxies-operator /usr/local/bin/egress-proxies-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/egress-proxies-operator"]
