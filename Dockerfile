# syntax=docker/dockerfile:1
# The operator image: a release build on Debian 12, run as uid 65532 with
# only libvirt's client library (kvm provider) and CA certificates.
#
#   TAG="$(sed -n 's/^version = "\(.*\)"$/\1/p' actors/Cargo.toml)-$(git rev-parse --short=12 HEAD)"
#   docker build --build-arg EPO_GIT_COMMIT="$(git rev-parse HEAD)" -t "egress-proxies-operator:$TAG" .
#
# EPO_GIT_COMMIT is what `--version` prints (the build context has no .git).
# A tag per build (version and commit) makes an upgrade roll the Deployment:
# docs/install.md.

# The `dist` profile: the release build with LTO (Cargo.toml).
FROM rust:1.95-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends pkg-config libssl-dev libvirt-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG EPO_GIT_COMMIT=unknown
ENV EPO_GIT_COMMIT=${EPO_GIT_COMMIT}
RUN cargo build --profile dist --locked -p egress-proxies-operator \
    && cp target/dist/egress-proxies-operator /egress-proxies-operator

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libvirt0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /egress-proxies-operator /usr/local/bin/egress-proxies-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/egress-proxies-operator"]
CMD ["run"]
