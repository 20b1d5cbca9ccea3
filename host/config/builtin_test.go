package config_test

import (
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host/builtin"
	"github.com/kvtier/kvtier/host/config"
)

func builtinModules(t *testing.T) config.Modules {
	t.Helper()
	tr, err := builtin.Tiers()
	if err != nil {
		t.Fatal(err)
	}
	ir, err := builtin.Indexes()
	if err != nil {
		t.Fatal(err)
	}
	pr, err := builtin.Policies()
	if err != nil {
		t.Fatal(err)
	}
	return config.Modules{Tiers: tr, Indexes: ir, Policies: pr}
}

// TestDefaultWithBuiltins checks that the embedded default stack loads
// with the modules this build registers, as `kvtier replay` and `kvtier
// serve` load it.
func TestDefaultWithBuiltins(t *testing.T) {
	s, err := config.Default(builtinModules(t))
	if err != nil {
		t.Fatalf("the embedded default stack does not load with the built-in modules:\n%v", err)
	}
	if s.Policy.Evictor != config.DefaultEvictor {
		t.Errorf("default evictor %q, want %q", s.Policy.Evictor, config.DefaultEvictor)
	}
}

// TestBuiltinOfflinePolicyRefused checks that a stack naming the offline
// belady oracle is refused by name (serve cannot supply the future).
func TestBuiltinOfflinePolicyRefused(t *testing.T) {
	y := "version: 1\nmodel: {page_tokens: 512, payloads: [{name: kv, page_bytes: 2MiB}]}\npolicy: {evictor: belady}\n"
	_, err := config.Load([]byte(y), "s.yaml", builtinModules(t))
	if err == nil || !strings.Contains(err.Error(), "$.policy.evictor") || !strings.Contains(err.Error(), "belady") {
		t.Fatalf("got %v, want belady refused at $.policy.evictor", err)
	}
}
