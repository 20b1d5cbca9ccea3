package l3disk

import (
	"os"
	"testing"

	"github.com/kvtier/kvtier/internal/bgprio"
)

// TestMain runs the package's tests the way kvtier serve runs the store:
// its gatherers, checkers, writers and syncer on lowered threads.
func TestMain(m *testing.M) {
	bgprio.Enable()
	os.Exit(m.Run())
}
