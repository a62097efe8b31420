# syntax=docker/dockerfile:1.7
#
# One image with all four binaries of idempotent-events, static (CGO off), on
# distroless/static as the nonroot user (uid 65532):
#   /usr/local/bin/receiver   (default entrypoint)
#   /usr/local/bin/worker
#   /usr/local/bin/migrate    (`migrate`, `migrate wait`)
#   /usr/local/bin/eventsctl
# The Helm chart sets the command of each container explicitly.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t idempotent-events:dev .
#
# hack/deploytest checks this file offline: BuildKit's parser and lint rules,
# COPY --from names, and the go build command below, run as is with the
# Makefile's flags, must produce static binaries that start.

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# Modules first, so source edits keep the download layer cached.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY pkg/ pkg/
COPY migrations/ migrations/
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/idempotent-events/idempotent-events/pkg/internal/telemetry.Version=${VERSION}" \
      -o /out/ ./cmd/receiver ./cmd/worker ./cmd/migrate ./cmd/eventsctl

FROM gcr.io/distroless/static-debian12:nonroot AS runtime
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="idempotent-events" \
      org.opencontainers.image.description="Stripe webhooks to exactly-once effects: receiver, worker, migrate, eventsctl" \
      org.opencontainers.image.source="https://github.com/idempotent-events/idempotent-events" \
      org.opencontainers.image.url="https://github.com/idempotent-events/idempotent-events" \
      org.opencontainers.image.documentation="https://github.com/idempotent-events/idempotent-events/blob/main/README.md#kubernetes" \
      org.opencontainers.image.vendor="idempotent-events" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# receiver HTTP, receiver metrics, worker metrics
EXPOSE 8080 9090 9091
ENTRYPOINT ["/usr/local/bin/receiver"]
