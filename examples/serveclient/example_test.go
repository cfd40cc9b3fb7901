package serveclient_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/examples/serveclient"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/serve"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const token = "example-token-0123456789"

// startServe runs dam serve on a fresh schema, with a route for
// customer-2 that ignores /updated_at, and returns its URL.
func startServe() (url string, stop func()) {
	dsn, err := pgtest.Schema()
	if err != nil {
		log.Fatal(err)
	}
	cfg := config.Default()
	cfg.Postgres.DSN = dsn
	r := config.DefaultRoute()
	r.Service, r.From, r.To, r.Ignore = "customer-2", "projections.customer-2", "delivery.customer-2", []string{"/updated_at"}
	cfg.Routes = []config.Route{r}
	cfg.Serve.Token = token
	store, err := dedup.Open(context.Background(), dsn, dedup.Config{MaxConns: 4})
	if err != nil {
		log.Fatal(err)
	}
	srv, err := serve.New(cfg, store)
	if err != nil {
		log.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	return ts.URL, func() { ts.Close(); store.Close() }
}

// The generated client against a running dam serve: a check, the same
// content again in another member order, a batch with a check the service
// refuses, the stored state, and a reset.
func Example() {
	url, stop := startServe()
	defer stop()
	ctx := context.Background()

	client, err := serveclient.NewClientWithResponses(url,
		serveclient.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	entity := "B-007"
	for _, payload := range []string{
		`{"banana_id":"B-007","ripeness_level":"Mostly Yellow","updated_at":1}`,
		`{"ripeness_level":"Mostly Yellow","banana_id":"B-007","updated_at":2}`,
	} {
		resp, err := client.CheckWithResponse(ctx, serveclient.CheckRequest{
			Service: "customer-2", Entity: &entity, Payload: json.RawMessage(payload)})
		if err != nil || resp.JSON200 == nil {
			log.Fatalf("check: %v %s", err, resp.Body)
		}
		fmt.Println("check:", resp.JSON200.Decision, resp.JSON200.Digest)
	}

	service, other, raw := "customer-2", "B-008", []byte{0xde, 0xad, 0xbe, 0xef}
	batch, err := client.CheckBatchWithResponse(ctx, serveclient.BatchRequest{Checks: []serveclient.CheckFields{
		{Service: &service, Entity: &other, Payload: json.RawMessage(`{"banana_id":"B-008"}`)},
		{Service: &service, Entity: &other, PayloadBase64: &raw}, // not JSON: customer-2's route hashes JSON
	}})
	if err != nil || batch.JSON200 == nil {
		log.Fatalf("batch: %v %s", err, batch.Body)
	}
	for i, r := range batch.JSON200.Results {
		if e, err := r.AsCheckError(); err == nil && e.Error.Code != "" {
			fmt.Printf("batch[%d]: %s\n", i, e.Error.Code)
			continue
		}
		d, err := r.AsCheckResult()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("batch[%d]: %s\n", i, d.Decision)
	}

	state, err := client.GetStateWithResponse(ctx, "customer-2", entity, nil)
	if err != nil || state.JSON200 == nil {
		log.Fatalf("state: %v %s", err, state.Body)
	}
	fmt.Println("state:", state.JSON200.Entity, state.JSON200.EntityHex, state.JSON200.Digest, state.JSON200.Source == nil)

	reset, err := client.ResetStateWithResponse(ctx, "customer-2", entity, nil)
	if err != nil || reset.JSON200 == nil {
		log.Fatalf("reset: %v %s", err, reset.Body)
	}
	fmt.Println("reset:", reset.JSON200.Reset)
	gone, err := client.GetStateWithResponse(ctx, "customer-2", entity, nil)
	if err != nil || gone.JSON404 == nil {
		log.Fatalf("state after reset: %v %s", err, gone.Body)
	}
	fmt.Println("state after reset:", gone.StatusCode(), gone.JSON404.Code)

	// Without the token: the documented 401.
	anon, err := serveclient.NewClientWithResponses(url)
	if err != nil {
		log.Fatal(err)
	}
	denied, err := anon.CheckWithResponse(ctx, serveclient.CheckRequest{Service: "customer-2", Entity: &entity, Payload: json.RawMessage(`1`)})
	if err != nil || denied.JSON401 == nil {
		log.Fatalf("anonymous check: %v %s", err, denied.Body)
	}
	fmt.Println("no token:", denied.StatusCode(), denied.JSON401.Code)
	// Output:
	// check: forward 0187510011c1a44aab0e29beabbe66f53b2c63844b503ebf819e4bd2e29babb7ab
	// check: duplicate 0187510011c1a44aab0e29beabbe66f53b2c63844b503ebf819e4bd2e29babb7ab
	// batch[0]: forward
	// batch[1]: bad_payload
	// state: B-007 422d303037 0187510011c1a44aab0e29beabbe66f53b2c63844b503ebf819e4bd2e29babb7ab true
	// reset: true
	// state after reset: 404 not_found
	// no token: 401 unauthorized
}
