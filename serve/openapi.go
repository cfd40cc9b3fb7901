package serve

import (
	_ "embed"
	"net/http"
	"strconv"
)

// openAPI is the API's OpenAPI 3.1 document. The contract test
// (contract_test.go) validates every request and response of this
// package's HTTP tests against it, so it describes what the code does.
//
//go:embed openapi.yaml
var openAPI []byte

// OpenAPI returns the check service's OpenAPI 3.1 document (YAML), which
// the service also serves at GET /v1/openapi.yaml. The caller must not
// modify it.
func OpenAPI() []byte { return openAPI }

// handleOpenAPI serves the document. It needs no token: it says what the
// API is, nothing of its data.
func handleOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Content-Length", strconv.Itoa(len(openAPI)))
	_, _ = w.Write(openAPI)
}
