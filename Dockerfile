# dam's container image: a static binary on a distroless base, non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t dam:dev .
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
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dam /usr/local/bin/dam
# Numeric, so that Kubernetes can check runAsNonRoot against the image.
USER 65532:65532
# /metrics, /healthz and /readyz (http.listen).
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/dam"]
CMD ["run", "--config", "/etc/dam/dam.yaml"]
