package pipeline_test

import (
	"testing"

	"github.com/dam-dedup/dam/internal/testutil/pgtest"
)

// TestMain gives the package's tests a real PostgreSQL (a throwaway cluster
// when none answers); each test then takes its own migrated schema.
func TestMain(m *testing.M) { pgtest.Main(m) }
