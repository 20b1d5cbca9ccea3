package tcpgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/consensus/grouptest"
)

const testGroup, testStack = 0x6e, 0x57

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start opens a group of size ranks on loopback sockets.
func start(t *testing.T, size int, timeout time.Duration) []*Member {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ms := make([]*Member, size)
	for r := range ms {
		ms[r], err = New(Options{Group: testGroup, Stack: testStack, Rank: r, Size: size, HubAddr: ln.Addr().String(), Listener: ln, Timeout: timeout, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, m := range ms {
			_ = m.Close()
		}
	})
	return ms
}

func TestLockstep(t *testing.T) {
	ticks := 2000
	if testing.Short() {
		ticks = 200
	}
	ms := start(t, 8, 10*time.Second)
	if err := grouptest.Lockstep(context.Background(), grouptest.AsGroups(ms), ticks, 11); err != nil {
		t.Fatal(err)
	}
}

// tick runs one tick on every rank not in skip and returns their errors
// and how long each took.
func tick(ms []*Member, t uint64, skip map[int]bool, mut func(r int, c *consensus.Contribution)) ([]error, []time.Duration) {
	errs, took := make([]error, len(ms)), make([]time.Duration, len(ms))
	var wg sync.WaitGroup
	for r, m := range ms {
		if skip[r] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := grouptest.ContributionAt(2, r, t)
			if mut != nil {
				mut(r, &c)
			}
			start := time.Now()
			_, errs[r] = m.Exchange(context.Background(), t, c)
			took[r] = time.Since(start)
		}()
	}
	wg.Wait()
	return errs, took
}

func TestRankThatDoesNotAnswer(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name   string
		victim int
		kill   bool // close the member (its process died) rather than stall
		want   string
	}{
		{"stalled rank", 3, false, "rank 3 at tick 2"},
		{"killed rank", 5, true, "rank 5 at tick 2"},
		{"killed hub", 0, true, "rank 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := start(t, 8, timeout)
			if errs, _ := tick(ms, 1, nil, nil); errors.Join(errs...) != nil {
				t.Fatal(errors.Join(errs...))
			}
			if tc.kill {
				_ = ms[tc.victim].Close()
			}
			errs, took := tick(ms, 2, map[int]bool{tc.victim: true}, nil)
			for r, err := range errs {
				if r == tc.victim {
					continue
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: got %v, want an error naming %q", r, err, tc.want)
				}
				if took[r] > 3*timeout {
					t.Errorf("rank %d: %v to fail with a %v deadline", r, took[r], timeout)
				}
				if ms[r].Err() == nil {
					t.Errorf("rank %d still reports healthy", r)
				}
			}
		})
	}
}

// rawCall sends bytes to the hub as a peer would, in one contribution
// frame, and returns the hub's refusal (nil for a frontier).
func rawCall(t *testing.T, addr string, req []byte) error {
	t.Helper()
	return rawFrame(t, addr, frameContribution, req)
}

func rawFrame(t *testing.T, addr string, typ byte, body []byte) error {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if err := writeFrame(conn, typ, body, nil); err != nil {
		t.Fatal(err)
	}
	got, resp, _, err := readFrame(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer from the hub: %v", err)
	}
	switch got {
	case frameFrontier:
		return nil
	case frameError:
		return hubError(9, 0, resp)
	}
	t.Fatalf("the hub answered a frame of type %d", got)
	return nil
}

func TestRefusedPeers(t *testing.T) {
	ms := start(t, 3, 5*time.Second)
	addr := ms[0].opts.Listener.Addr().String()
	if errs, _ := tick(ms, 1, nil, nil); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	enc := func(env consensus.Envelope, tk uint64) []byte {
		b, err := consensus.AppendContribution(nil, env, grouptest.ContributionAt(2, env.Rank, tk))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := consensus.Envelope{Group: testGroup, Stack: testStack, Rank: 2, Size: 3}
	for _, tc := range []struct {
		name string
		req  []byte
		want error
		msg  []string
	}{
		{"another group", enc(consensus.Envelope{Group: 1, Stack: testStack, Rank: 2, Size: 3}, 2), consensus.ErrForeign, []string{"rank 2 (127.0.0.1:", "tick 2"}},
		{"another stack", enc(consensus.Envelope{Group: testGroup, Stack: 1, Rank: 2, Size: 3}, 2), consensus.ErrForeign, []string{"rank 2 (127.0.0.1:", "tick 2"}},
		{"replayed old tick", enc(good, 1), consensus.ErrTick, []string{"rank 2 (127.0.0.1:", "tick 1", "replayed"}},
		{"malformed", enc(good, 2)[:60], consensus.ErrMalformed, []string{"rank 2 (127.0.0.1:", "tick 2"}},
		{"claims the hub's rank", enc(consensus.Envelope{Group: testGroup, Stack: testStack, Rank: 0, Size: 3}, 2), consensus.ErrForeign, []string{"rank 0 (127.0.0.1:"}},
	} {
		err := rawCall(t, addr, tc.req)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
			continue
		}
		for _, m := range tc.msg {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, m)
			}
		}
	}
	// None of that disturbed the group.
	if errs, _ := tick(ms, 2, nil, nil); errors.Join(errs...) != nil {
		t.Fatalf("the group after refusals: %v", errors.Join(errs...))
	}
}

func TestWrongShapeStopsEveryRank(t *testing.T) {
	ms := start(t, 4, 5*time.Second)
	errs, _ := tick(ms, 1, nil, func(r int, c *consensus.Contribution) {
		if r == 2 {
			c.Shape.Classes++
			c.Counts = append(c.Counts, consensus.Counts{})
		}
	})
	for r, err := range errs {
		if !errors.Is(err, consensus.ErrShape) || !strings.Contains(err.Error(), "rank 2") || !strings.Contains(err.Error(), "tick 1") {
			t.Errorf("rank %d: got %v, want a shape error naming rank 2 at tick 1", r, err)
		}
	}
	errs, _ = tick(ms, 2, nil, nil)
	for r, err := range errs {
		if !errors.Is(err, consensus.ErrStopped) {
			t.Errorf("rank %d after the stop: got %v, want ErrStopped", r, err)
		}
	}
}

func TestDigestMismatchOverTCP(t *testing.T) {
	ms := start(t, 4, 5*time.Second)
	errs, _ := tick(ms, 16, nil, func(r int, c *consensus.Contribution) {
		if r == 3 {
			c.Structures[consensus.StructTree][0] ^= 1
			c.Digest[0] ^= 1
		}
	})
	for r, err := range errs {
		if !errors.Is(err, consensus.ErrDigestMismatch) || !strings.Contains(err.Error(), "tree") || !strings.Contains(err.Error(), "tick 16") {
			t.Errorf("rank %d: got %v", r, err)
		}
	}
}

func TestOptionsRefused(t *testing.T) {
	for _, o := range []Options{
		{Size: 0}, {Size: 2, Rank: 2}, {Size: 2, Rank: 0}, {Size: 2, Rank: 1}, {Size: 2, Rank: 1, HubAddr: "x", Timeout: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// BenchmarkExchange8 times one tick of an 8-rank group over loopback
// (wall clock; `kvtier bench group` has the comparison with raw TCP).
func BenchmarkExchange8(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ms := make([]*Member, 8)
	for r := range ms {
		ms[r], err = New(Options{Group: 1, Stack: 1, Rank: r, Size: 8, HubAddr: ln.Addr().String(), Listener: ln, Timeout: 10 * time.Second, Logger: quiet()})
		if err != nil {
			b.Fatal(err)
		}
		defer ms[r].Close()
	}
	s := consensus.Shape{Classes: 4, OKBits: 64, Reloads: 16}
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := 1; t <= b.N; t++ {
				if _, err := m.Exchange(context.Background(), uint64(t), consensus.NewContribution(uint64(t), s)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestHubNeverThere: a rank whose hub never comes up (nothing listens at
// its address) does not wait for it forever: its first exchange fails
// within the deadline's backstop, naming the hub and the tick.
func TestHubNeverThere(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	m, err := New(Options{Group: testGroup, Stack: testStack, Rank: 1, Size: 2, HubAddr: addr, Timeout: 200 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := consensus.NewContribution(1, consensus.Shape{Classes: 1})
	done := make(chan error, 1)
	t0 := time.Now()
	go func() {
		_, err := m.Exchange(context.Background(), 1, c)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, consensus.ErrTimeout) || !strings.Contains(err.Error(), "hub") {
			t.Fatalf("exchange without a hub: %v, want a timeout naming the hub", err)
		}
		t.Logf("failed after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	case <-time.After(5 * time.Second):
		t.Fatal("an exchange waited 5 s for a hub that is not there (deadline 200 ms)")
	}
}

// TestBadFrames: bytes that are not a frame, or a frame that is not a
// contribution, are refused with an error naming the peer; the group goes
// on undisturbed.
func TestBadFrames(t *testing.T) {
	ms := start(t, 2, 5*time.Second)
	addr := ms[0].opts.Listener.Addr().String()
	if errs, _ := tick(ms, 1, nil, nil); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	send := func(raw []byte) error {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(raw); err != nil {
			t.Fatal(err)
		}
		typ, body, _, err := readFrame(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer to %x: %v", raw, err)
		}
		if typ != frameError {
			t.Fatalf("answer of type %d to %x", typ, raw)
		}
		return hubError(9, 0, body)
	}
	huge := []byte{0xff, 0xff, 0xff, 0x7f, frameContribution}
	for _, tc := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"length beyond the largest message", huge, "length 2147483647"},
		{"empty frame", []byte{0, 0, 0, 0, frameContribution}, "length 0"},
		{"a frontier sent to the hub", append([]byte{2, 0, 0, 0, frameFrontier}, 'x'), "type 2, want a contribution"},
	} {
		err := send(tc.raw)
		if !errors.Is(err, consensus.ErrMalformed) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "127.0.0.1:") {
			t.Errorf("%s: %v, want a malformed-frame refusal naming the peer and %q", tc.name, err, tc.want)
		}
	}
	if errs, _ := tick(ms, 2, nil, nil); errors.Join(errs...) != nil {
		t.Fatalf("the group after bad frames: %v", errors.Join(errs...))
	}
}

// FuzzReadFrame: any bytes are a frame within the bounds or an error;
// never a panic, never a read past the length.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, frameContribution, 1, 2})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, body, _, err := readFrame(bufio.NewReader(bytes.NewReader(b)), nil)
		if err != nil {
			return
		}
		if len(body)+frameHeader > len(b) || len(body) > maxFrame {
			t.Fatalf("frame of type %d with %d body bytes from %d input bytes", typ, len(body), len(b))
		}
	})
}
