# dam's container image: a static binary on a distroless base, non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t dam:dev .
# Base images: pinned by tag only, not yet by digest. A tag can be moved
# under a build; a digest cannot. Pin both FROM lines (and Dockerfile.release's)
# as NAME:TAG@sha256:..., with the digest of the multi-platform index (what
# `crane digest NAME:TAG` or `docker buildx imagetools inspect NAME:TAG`
# prints, so that every platform resolves), taken on a machine that reaches
# the registry: the one these files were last edited on could not, and a
# digest that nobody read from the registry is not written here.
# Build stage: the Go version of go.mod.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
# Modules first, so that a source change reuses the downloaded modules.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# Static (no cgo: no libc needed), reproducible paths, version stamped.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/dam ./cmd/dam

# Run stage: no shell, no package manager; CA certificates and tzdata only.
# Not pinned by digest yet: see the top of this file.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dam /usr/local/bin/dam
# Numeric, so that Kubernetes can check runAsNonRoot against the image.
USER 65532:65532
# /metrics, /healthz and /readyz (http.listen).
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/dam"]
CMD ["run", "--config", "/etc/dam/dam.yaml"]
