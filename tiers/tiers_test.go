package tiers_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/memstore"
)

func geometry() tiers.PayloadGeometry {
	return tiers.PayloadGeometry{PageTokens: 512, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 4096}, {Name: "index", PageBytes: 64}}}
}

func TestPageBytes(t *testing.T) {
	g := geometry()
	for _, tc := range []struct {
		kind tiers.PayloadKind
		want int64
		err  bool
	}{{0, 4096, false}, {1, 64, false}, {2, 0, true}, {255, 0, true}} {
		got, err := g.PageBytes(tc.kind)
		if tc.err != (err != nil) || got != tc.want {
			t.Errorf("PageBytes(%d) = %d, %v; want %d, error %v", tc.kind, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, tiers.ErrInvalid) {
			t.Errorf("PageBytes(%d) error %v does not wrap ErrInvalid", tc.kind, err)
		}
	}
}

func TestEnvValidate(t *testing.T) {
	ok := tiers.Env{Logger: slog.New(slog.DiscardHandler), Payload: geometry(), WorldSize: 4, Rank: 3}
	tests := []struct {
		name   string
		mutate func(*tiers.Env)
		want   string
	}{
		{"valid", func(*tiers.Env) {}, ""},
		{"no logger", func(e *tiers.Env) { e.Logger = nil }, "logger is nil"},
		{"no payloads", func(e *tiers.Env) { e.Payload.Kinds = nil }, "payload geometry is empty"},
		{"no page tokens", func(e *tiers.Env) { e.Payload.PageTokens = 0 }, "payload geometry is empty"},
		{"rank past world", func(e *tiers.Env) { e.Rank = 4 }, "rank 4 of world size 4"},
		{"negative rank", func(e *tiers.Env) { e.Rank = -1 }, "rank -1"},
		{"zero world", func(e *tiers.Env) { e.WorldSize, e.Rank = 0, 0 }, "world size 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := ok
			tc.mutate(&e)
			err := e.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRegistryRoles(t *testing.T) {
	r := tiers.NewRegistry()
	if err := memstore.Register(r); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kind string
		role string
		err  bool
	}{{"pool", string(tiers.PoolV1), false}, {"slab", string(tiers.SlabV1), false}, {"store", string(tiers.StoreV1), false}, {"disk", "", true}} {
		got, err := tiers.Role(tc.kind)
		if string(got) != tc.role || tc.err != (err != nil) {
			t.Errorf("Role(%q) = %q, %v", tc.kind, got, err)
		}
	}
	if cfg, err := r.NewConfig(tiers.StoreV1, memstore.Name); err != nil || cfg == nil {
		t.Fatalf("NewConfig(store, memstore) = %v, %v", cfg, err)
	}
	if _, err := r.NewConfig(tiers.SlabV1, memstore.Name); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("NewConfig(slab, memstore) = %v, want not registered", err)
	}
	if _, err := r.NewConfig("kvtier.tier.bogus.v1", "x"); err == nil {
		t.Fatal("NewConfig of an unknown role: no error")
	}
}
