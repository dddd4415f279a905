# The coordinator's image: built with the Rust toolchain, run on distroless
# (glibc and libgcc, no shell, no package manager) as a non-root user.
#
#   docker build -t idempotency-coordinator .
#   docker run -p 50051:50051 -e DATABASE_URL=postgres://user:pass@db:5432/app idempotency-coordinator
#
# The image holds the server alone: it needs --database-url (or
# DATABASE_URL); the private PostgreSQL of local development is not in it,
# and neither is its downloader (built without the default
# `download-postgresql` feature).

# The full image, not -slim: jemalloc's build needs make.
FROM rust:1.95-bookworm AS build
WORKDIR /src

# Dependencies first, in a layer of their own that stays cached while only
# the coordinator's code changes: build them against stand-in sources.
# The workspace's other members, the Rust client, the benchmark, the
# sidecar and the tests' shared harnesses, are not built here, but cargo
# reads their manifests: each gets a stand-in library (and the sidecar a
# stand-in binary). Only the two packages the image runs are selected
# (-p): the benchmark and the harnesses ask for the coordinator's default
# features, the PostgreSQL downloader among them.
COPY Cargo.toml Cargo.lock build.rs ./
COPY clients/rust/Cargo.toml clients/rust/Cargo.toml
COPY bench/Cargo.toml bench/Cargo.toml
COPY sidecar/Cargo.toml sidecar/Cargo.toml
COPY test-support/Cargo.toml test-support/Cargo.toml
COPY proto proto
RUN mkdir -p src clients/rust/src bench/src sidecar/src test-support/src \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > sidecar/src/main.rs \
 && touch src/lib.rs clients/rust/src/lib.rs bench/src/lib.rs sidecar/src/lib.rs test-support/src/lib.rs \
 && cargo build --release --locked -p idempotency-coordinator --no-default-features \
    --bin idempotency-coordinator \
 && rm -rf src sidecar/src clients/rust/src

COPY sql sql
COPY src src
# The sidecar (idempotency-sidecar, docs/sidecar.md), built on the Rust
# client: both real now.
COPY clients/rust clients/rust
COPY sidecar sidecar
# The stand-ins' outputs are older than the real sources only by mtime
# order of the copy; touch so cargo rebuilds the crates themselves.
RUN touch src/main.rs src/lib.rs clients/rust/src/lib.rs sidecar/src/main.rs sidecar/src/lib.rs \
 && cargo build --release --locked -p idempotency-coordinator -p idempotency-sidecar --no-default-features \
    --bin idempotency-coordinator --bin idempotency-sidecar \
 && cp target/release/idempotency-coordinator /idempotency-coordinator \
 && cp target/release/idempotency-sidecar /idempotency-sidecar

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="idempotency-coordinator" \
      org.opencontainers.image.description="A gRPC coordinator that lets services in any language run each side-effecting operation exactly once, decided in PostgreSQL." \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /idempotency-coordinator /usr/local/bin/idempotency-coordinator
# The Idempotency-Key reverse proxy: run it with
# --entrypoint /usr/local/bin/idempotency-sidecar (deploy/sidecar/).
COPY --from=build /idempotency-sidecar /usr/local/bin/idempotency-sidecar
# distroless's nonroot user, by number so that Kubernetes can check runAsNonRoot.
USER 65532:65532
# Configure the server through its environment (IDEMPOTENCY_LISTEN,
# IDEMPOTENCY_TLS_CERT, ...; `serve --help` names each), not flags: the
# health check below is another process, and reads the same variables, so
# it asks the port and speaks the TLS the server was given.
ENV IDEMPOTENCY_LISTEN=0.0.0.0:50051
EXPOSE 50051
# Ready while the server answers its own readiness check (no shell here).
HEALTHCHECK --interval=5s --timeout=6s --retries=3 \
    CMD ["/usr/local/bin/idempotency-coordinator", "health"]
# The server drains on SIGTERM (readiness first, then calls in flight).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/idempotency-coordinator"]
CMD ["serve"]
