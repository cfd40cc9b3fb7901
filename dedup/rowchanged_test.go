package dedup_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

// TestDecideRowChangedAfterRead: a row that a concurrent transaction
// rewrites after Decide read it (Decide's rewrite waits for that
// transaction, which then commits the batch's own content) must not be
// written over with a decision made on the old state: Decide loses the
// race, runs again on the new state and decides Duplicate (a stale Forward
// would deliver a duplicate), in every mode. The same for a row deleted
// after the read (a reset): decided again, it is a new identity.
func TestDecideRowChangedAfterRead(t *testing.T) {
	t.Parallel()
	shapes(t, func(t *testing.T, shape func(*dedup.Store) *dedup.Store) {
		for _, c := range []struct {
			name, table, key, change string
			rule                     dedup.Rule
			want                     []dedup.Decision
		}{
			{"last-seen rewritten", "state", "entity", `UPDATE state SET digest = $1 WHERE entity = 'e'`, dedup.Rule{}, []dedup.Decision{D}},
			{"last-seen deleted", "state", "entity", `DELETE FROM state WHERE entity = 'e' AND $1::bytea IS NOT NULL`, dedup.Rule{}, []dedup.Decision{F}},
			{"version rewritten", "versions", "entity", `UPDATE versions SET version = 2, digest = $1 WHERE entity = 'e'`, dedup.Rule{Mode: dedup.Version}, []dedup.Decision{D}},
			{"window extended", "window_ids", "id", `UPDATE window_ids SET expires_at = now() + interval '1 hour' WHERE id = 'e' AND $1::bytea IS NOT NULL`,
				dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}, []dedup.Decision{D}},
		} {
			t.Run(c.name, func(t *testing.T) {
				s := shape(newStore(t))
				ctx := context.Background()
				p, epoch := partition(t, s, "in")
				first := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Rule: c.rule, Start: 0, End: 1,
					Records: []dedup.Record{{Offset: 0, Entity: []byte("e"), Digest: digest("A"), Version: 1}}}
				if c.rule.Mode == dedup.Window {
					// An expired id: the next record is forwarded afresh
					// unless the change extends it first.
					first.Now = time.Now().Add(-2 * time.Hour)
				}
				if _, err := s.Decide(ctx, first, nil); err != nil {
					t.Fatal(err)
				}
				other, err := s.Pool().Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Rollback(ctx)
				b := digest("B")
				if _, err := other.Exec(ctx, c.change, b[:]); err != nil {
					t.Fatal(err)
				}
				var xid string
				if err := other.QueryRow(ctx, `SELECT pg_current_xact_id()::xid::text`).Scan(&xid); err != nil {
					t.Fatal(err)
				}
				batch := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Rule: c.rule, Start: 1, End: 2,
					Records: []dedup.Record{{Offset: 1, Entity: []byte("e"), Digest: b, Version: 2}}}
				// Decide reads the committed row and writes it, waiting for
				// the open transaction (on Citus its claim waits).
				done := decideBlocked(ctx, t, s, batch, xid, "the concurrent change")
				if err := other.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				r := <-done
				if r.err != nil || !slices.Equal(r.got, c.want) {
					t.Fatalf("Decide after the change: %v, %v; want %v", r.got, r.err, c.want)
				}
			})
		}
	})
}
