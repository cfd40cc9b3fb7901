package serve_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// linInput is one operation's effect on one identity: the contents it
// checked, in order (a batch may repeat an identity).
type linInput struct {
	entity   string
	contents []int
}

// registerModel is last-seen semantics for one identity: the state is the
// last forwarded content (-1: none); a content is forward iff it differs.
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byEntity := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			e := op.Input.(linInput).entity
			if _, ok := byEntity[e]; !ok {
				order = append(order, e)
			}
			byEntity[e] = append(byEntity[e], op)
		}
		parts := make([][]porcupine.Operation, 0, len(order))
		for _, e := range order {
			parts = append(parts, byEntity[e])
		}
		return parts
	},
	Init: func() any { return -1 },
	Step: func(state, input, output any) (bool, any) {
		last := state.(int)
		for i, c := range input.(linInput).contents {
			want := "duplicate"
			if c != last {
				want = "forward"
			}
			if output.([]string)[i] != want {
				return false, state
			}
			last = c
		}
		return true, last
	},
	DescribeOperation: func(input, output any) string {
		in := input.(linInput)
		return fmt.Sprintf("%s %v -> %v", in.entity, in.contents, output)
	},
}

// TestLinearizable runs concurrent HTTP clients on a few hot identities,
// half with single checks and half with batches (an identity may repeat in
// a batch), and checks the history against last-seen semantics with
// porcupine: every identity's answers must be those of some sequential
// order consistent with real time.
func TestLinearizable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	// Two contents on six identities: with more contents or fewer
	// identities nearly every answer has a concurrent operation that could
	// explain it, and a server answering wrong one time in seven passed;
	// with these it fails every time (checked by breaking the handler).
	const (
		clients  = 24
		opsEach  = 30
		hot      = 6
		contents = 2
	)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	// post returns the answer and when its successful attempt was sent. A
	// 503 "overloaded" promises that nothing was decided, so the client
	// retries it as a real one would, and the operation begins at the
	// attempt that was answered. Were the promise broken, the shed
	// attempt's write would show in later answers and fail the check.
	post := func(path string, body any) ([]byte, int64, error) {
		b, _ := json.Marshal(body)
		for attempt := 0; ; attempt++ {
			req, _ := http.NewRequest("POST", h.url+path, bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+tokenAll)
			call := now()
			resp, err := client.Do(req)
			if err != nil {
				return nil, 0, err
			}
			out, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(out, []byte(`"overloaded"`)) && attempt < 100 {
				time.Sleep(time.Duration(5+attempt) * time.Millisecond)
				continue
			}
			if resp.StatusCode != 200 {
				return nil, 0, fmt.Errorf("%d %s", resp.StatusCode, out)
			}
			return out, call, err
		}
	}
	type check struct {
		Service string `json:"service"`
		Entity  string `json:"entity"`
		Payload any    `json:"payload"`
	}
	var mu sync.Mutex
	var history []porcupine.Operation
	record := func(client int, call, ret int64, entities []string, cs []int, decisions []string) {
		byEntity := map[string]*linInput{}
		outs := map[string][]string{}
		var order []string
		for i, e := range entities {
			if byEntity[e] == nil {
				byEntity[e] = &linInput{entity: e}
				order = append(order, e)
			}
			byEntity[e].contents = append(byEntity[e].contents, cs[i])
			outs[e] = append(outs[e], decisions[i])
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range order {
			history = append(history, porcupine.Operation{ClientId: client, Input: *byEntity[e], Call: call, Output: outs[e], Return: ret})
		}
	}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for range opsEach {
				n := 1
				if c%2 == 1 {
					n = 1 + rng.IntN(3)
				}
				var ents []string
				var cs []int
				var checks []check
				for range n {
					e, v := fmt.Sprint("hot-", rng.IntN(hot)), rng.IntN(contents)
					ents, cs = append(ents, e), append(cs, v)
					// Member order varies: the structural hash must not care.
					var payload any = map[string]any{"content": v, "pad": "x"}
					if rng.IntN(2) == 0 {
						payload = json.RawMessage(fmt.Sprintf(`{"pad":"x", "content":%d}`, v))
					}
					checks = append(checks, check{"svc", e, payload})
				}
				var call int64
				var decisions []string
				if c%2 == 0 {
					out, at, err := post("/v1/check", checks[0])
					call = at
					if err != nil {
						t.Errorf("check: %v", err)
						continue
					}
					var r struct{ Decision string }
					if err := json.Unmarshal(out, &r); err != nil {
						t.Errorf("check: %v", err)
						continue
					}
					decisions = []string{r.Decision}
				} else {
					out, at, err := post("/v1/check:batch", map[string]any{"checks": checks})
					call = at
					if err != nil {
						t.Errorf("batch: %v", err)
						continue
					}
					var r struct{ Results []struct{ Decision string } }
					if err := json.Unmarshal(out, &r); err != nil || len(r.Results) != n {
						t.Errorf("batch: %s %v", out, err)
						continue
					}
					for _, x := range r.Results {
						decisions = append(decisions, x.Decision)
					}
				}
				record(c, call, now(), ents, cs, decisions)
			}
		}()
	}
	wg.Wait()
	res, _ := porcupine.CheckOperationsVerbose(registerModel, history, 60*time.Second)
	t.Logf("checked %d per-identity operations from %d clients: %s", len(history), clients, res)
	if res != porcupine.Ok {
		t.Fatalf("history is not linearizable: %s", res)
	}
}
