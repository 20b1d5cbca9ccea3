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
	if s.Policy.Evictor != config.DefaultEvictor || s.Payload.PageTokens != config.DefaultPageTokens ||
		len(s.Payload.Kinds) != 1 || s.Payload.Kinds[0].PageBytes != int64(config.DefaultPayloadBytes) {
		t.Errorf("default stack %+v", s)
	}
	var roles []string
	for _, tier := range s.Tiers {
		roles = append(roles, string(tier.Role)+":"+tier.Use)
	}
	if got, want := strings.Join(roles, " "), "slab:l2hugetlb store:l3disk"; got != want {
		t.Errorf("default tiers %q, want %q", got, want)
	}
	if ix := s.Tiers[1].Index; ix == nil || ix.Use != "lmdb" {
		t.Errorf("default l3 index %+v, want lmdb", ix)
	}
	// The built-in modules' configs print and load back to the same text.
	out := s.String()
	s2, err := config.Load([]byte(out), "default.out.yaml", builtinModules(t))
	if err != nil {
		t.Fatalf("the printed default stack does not load:\n%s\n%v", out, err)
	}
	if out2 := s2.String(); out2 != out {
		t.Fatalf("printing the default stack is not a fixed point:\n%s\n---\n%s", out, out2)
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
