package dedup

import (
	"context"
	"fmt"
)

// SetDecideAttempts sets the base number of runs of a Decide that loses
// races, for a test, and returns a function restoring it.
func SetDecideAttempts(n int) (restore func()) {
	old := maxDecideAttempts
	maxDecideAttempts = n
	return func() { maxDecideAttempts = old }
}

// SetClaims makes s run the statements of Citus on any engine, for a
// test: Decide locks by writing, and ResetService, PruneState, PruneWindow
// and CleanupWindow delete without FOR UPDATE.
func SetClaims(s *Store) { s.claims = true }

// Classify classifies err as a store of the given engine does.
func Classify(distributed bool, err error) error {
	s := &Store{}
	if distributed {
		s.engine.Store(engineDistributed)
	} else {
		s.engine.Store(engineOneServer)
	}
	return s.classify("op", err)
}

// CitusShapes reports whether s runs the statements written for Citus
// (its tables are distributed, or SetClaims).
func CitusShapes(ctx context.Context, s *Store) (bool, error) { return s.citusShapes(ctx) }

// The named array parameters of a decide (arrays.go), for a test.
type (
	ByteaArray = byteaArray
	Int8Array  = int8Array
	Int2Array  = int2Array
	TIDArray   = tidArray
)

// SQLPlans is the statement setting a decide's planner settings.
const SQLPlans = sqlPlans

// The statements of a decide's lock and rewrite, for a test of their plans.
const (
	SQLReadState    = sqlReadStateRows
	SQLLockState    = sqlLockState
	SQLReadWindow   = sqlReadWindowRows
	SQLUpdateState  = sqlUpdateState
	SQLLockWindow   = sqlLockWindow
	SQLUpdateWindow = sqlUpdateWindow
	SQLExtendWindow = sqlExtendWindowTIDs
)

// Identify is identify: a batch's distinct entities in key order, a
// function finding an entity's index in them, and each record's slot.
func Identify(recs []Record) ([][]byte, func([]byte) (int, bool), []int32) {
	entities, index, slots := identify(recs)
	return entities, index.find, slots
}

// ServiceWalk is one statement that walks one service's rows, with
// arguments for a first chunk of service.
type ServiceWalk struct {
	Name string
	SQL  string
	Args []any
}

// ServiceWalks returns every statement that walks one service's rows
// (Count, and the chunks of ResetService and PruneState in both shapes),
// with arguments for a first chunk of service of the default size, for a
// test of their plans.
func ServiceWalks(service string) []ServiceWalk {
	w := []ServiceWalk{{"count", sqlCount, []any{service}}}
	for _, t := range identityTables {
		for shape, sql := range map[string]string{"": sqlResetChunk, " (citus)": sqlResetChunkCitus} {
			w = append(w, ServiceWalk{"reset " + t.table + shape, fmt.Sprintf(sql, t.table, t.column, ">="), []any{service, []byte{}, resetBatch}})
		}
	}
	for _, table := range []string{"state", "versions"} {
		for shape, sql := range map[string]string{"": sqlPruneChunk, " (citus)": sqlPruneChunkCitus} {
			for step, cond := range map[string]string{"first": pruneFirstService, "next": pruneNextService} {
				w = append(w, ServiceWalk{"prune " + table + " " + step + shape, fmt.Sprintf(sql, table, cond), []any{service, []byte{}, pruneBatch, 3600.0}})
			}
		}
	}
	return w
}

// HashBytes is PostgreSQL's hash of a bytea, as Citus hashes a
// distribution column (shards.go).
func HashBytes(b []byte) int32 { return hashBytes(b) }

// ShardGroups returns how a routed decide of s groups entities by shard
// (indexes into entities), reading the shard map as a decide does; nil
// when s does not route.
func ShardGroups(ctx context.Context, s *Store, entities [][]byte) ([][]int, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	m := s.shardRouting(ctx, conn.Conn())
	if m == nil {
		return nil, nil
	}
	return m.groups(entities), nil
}

// ShardMapShards is the number of shards of s's kept shard map (0: none
// kept, or one that does not route).
func ShardMapShards(s *Store) int {
	if m := s.shards.Load(); m != nil {
		return len(m.mins)
	}
	return 0
}

// ValuesRows is the number of rows of the placeholders' statement for n
// identities.
func ValuesRows(n int) int { return valuesRows(n) }

// SetUnrouted makes s decide on Citus without routing by shard, as before
// shards.go: one claim and one read of every identity.
func SetUnrouted(s *Store) { s.unrouted = true }
