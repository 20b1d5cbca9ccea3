package indexes_test

import (
	"testing"
	"time"

	"github.com/kvtier/kvtier/indexes"
)

func TestCloseGate(t *testing.T) {
	var g indexes.CloseGate
	if !g.Enter() {
		t.Fatal("open gate refused a call")
	}
	closed := make(chan bool)
	go func() { closed <- g.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a call was in flight")
	case <-time.After(20 * time.Millisecond):
	}
	// A call arriving while Close waits is refused, not blocked.
	for deadline := time.Now().Add(time.Second); g.Enter(); {
		g.Exit()
		if time.Now().After(deadline) {
			t.Fatal("gate still admits calls a second after Close began")
		}
	}
	g.Exit()
	if !<-closed {
		t.Fatal("first Close reported the gate already closed")
	}
	if g.Close() {
		t.Fatal("second Close reported it closed the gate")
	}
}
