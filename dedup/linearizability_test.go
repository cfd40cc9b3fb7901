package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// linInput is one operation's effect on one identity: the digests it
// decided, in order (a Decide batch may repeat an identity).
type linInput struct {
	entity   string
	contents []int
}

// registerModel is last-seen semantics for one identity: the state is the
// last forwarded content (-1: none), and a content is Forward iff it
// differs.
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
		var parts [][]porcupine.Operation
		for _, e := range order {
			parts = append(parts, byEntity[e])
		}
		return parts
	},
	Init: func() any { return -1 },
	Step: func(state, input, output any) (bool, any) {
		last := state.(int)
		decisions := output.([]dedup.Decision)
		for i, c := range input.(linInput).contents {
			want := dedup.Duplicate
			if c != last {
				want = dedup.Forward
			}
			if decisions[i] != want {
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

// TestLinearizable runs concurrent deciders on a few hot identities, half
// through Check in their own transactions (some rolled back on purpose),
// half through Decide on their own partitions, and checks the history
// against last-seen semantics with porcupine.
func TestLinearizable(t *testing.T) {
	t.Parallel()
	shapes(t, testLinearizable)
}

func testLinearizable(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
	s, err := dedup.Open(context.Background(), pgtest.DSN(t), dedup.Config{MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	shape(s)
	const (
		workers  = 32
		opsEach  = 25
		hot      = 4
		contents = 3
	)
	epoch0 := time.Now()
	now := func() int64 { return int64(time.Since(epoch0)) }
	var mu sync.Mutex
	var history []porcupine.Operation
	var rolledBack, failed int
	record := func(client int, call, ret int64, entities []string, contents []int, out []dedup.Decision) {
		// Split a batch into one operation per identity over the same
		// interval: each identity's register must be linearizable.
		byEntity := map[string]*struct {
			c []int
			d []dedup.Decision
		}{}
		var order []string
		for i, e := range entities {
			if byEntity[e] == nil {
				byEntity[e] = &struct {
					c []int
					d []dedup.Decision
				}{}
				order = append(order, e)
			}
			byEntity[e].c = append(byEntity[e].c, contents[i])
			byEntity[e].d = append(byEntity[e].d, out[i])
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range order {
			history = append(history, porcupine.Operation{ClientId: client, Input: linInput{e, byEntity[e].c},
				Call: call, Output: byEntity[e].d, Return: ret})
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			if w%2 == 0 { // Check in its own transaction
				for range opsEach {
					e, c := fmt.Sprint("hot-", rng.IntN(hot)), rng.IntN(contents)
					rollback := rng.IntN(5) == 0
					call := now()
					var d dedup.Decision
					err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
						var err error
						d, err = dedup.Check(ctx, tx, "svc", []byte(e), digest(fmt.Sprint(c)))
						if err == nil && rollback {
							err = errRollback
						}
						return err
					})
					ret := now()
					switch {
					case errors.Is(err, errRollback):
						mu.Lock()
						rolledBack++ // no effect: not part of the history
						mu.Unlock()
					case err != nil:
						mu.Lock()
						failed++
						mu.Unlock()
						t.Errorf("Check: %v", err)
					default:
						record(w, call, ret, []string{e}, []int{c}, []dedup.Decision{d})
					}
				}
				return
			}
			p, epoch := partition(t, s, fmt.Sprint("lin-", w))
			var next int64
			var out []dedup.Decision
			for range opsEach {
				n := 1 + rng.IntN(3)
				b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: next, End: next + int64(n)}
				var ents []string
				var cs []int
				for i := range n {
					e, c := fmt.Sprint("hot-", rng.IntN(hot)), rng.IntN(contents)
					ents, cs = append(ents, e), append(cs, c)
					b.Records = append(b.Records, dedup.Record{Offset: next + int64(i), Entity: []byte(e), Digest: digest(fmt.Sprint(c))})
				}
				call := now()
				var err error
				out, err = s.Decide(ctx, b, out)
				ret := now()
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					t.Errorf("Decide: %v", err)
					continue
				}
				next = b.End
				record(w, call, ret, ents, cs, out)
			}
		}()
	}
	wg.Wait()
	res, info := porcupine.CheckOperationsVerbose(registerModel, history, 30*time.Second)
	t.Logf("checked %d per-identity operations (%d Check transactions rolled back, %d failed): %s",
		len(history), rolledBack, failed, res)
	if res != porcupine.Ok {
		_ = info
		t.Fatalf("history is not linearizable: %s", res)
	}
}
