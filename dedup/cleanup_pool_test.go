package dedup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// Window cleanups that each hold a pool connection (their advisory lock)
// never wait for a second one of the same pool: with more window routes
// than postgres.max_conns, every cleanup at start still finishes. (The
// engine a cleanup's statements are shaped for is learned on the
// connection it holds, not on another.)
func TestWindowCleanupsOutnumberingThePool(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := dedup.Open(context.Background(), dsn, dedup.Config{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = s.CleanupWindow(ctx, fmt.Sprintf("window-%d", i), dedup.WithBatchSize(100))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("cleanup %d of 6 on a pool of 2: %v", i, err)
		}
	}
}
