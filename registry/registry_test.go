package registry_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/registry"
)

type factory func() string

const (
	typeA registry.TypeID = "kvtier.test.a.v1"
	typeB registry.TypeID = "kvtier.test.b.v1"
)

func reg(t registry.TypeID, name string) registry.Registration[factory] {
	return registry.Registration[factory]{Type: t, Name: name, Factory: func() string { return string(t) + "/" + name }}
}

func TestRegister(t *testing.T) {
	tests := []struct {
		name    string
		regs    []registry.Registration[factory]
		wantErr error  // sentinel the last registration's error must wrap
		errText string // or text it must contain
	}{
		{name: "distinct", regs: []registry.Registration[factory]{reg(typeA, "x"), reg(typeA, "y"), reg(typeB, "x")}},
		{name: "duplicate", regs: []registry.Registration[factory]{reg(typeA, "x"), reg(typeA, "x")}, wantErr: registry.ErrDuplicate},
		{name: "empty name", regs: []registry.Registration[factory]{reg(typeA, "")}, errText: "type and name must both be set"},
		{name: "empty type", regs: []registry.Registration[factory]{reg("", "x")}, errText: "type and name must both be set"},
		{name: "slash in name", regs: []registry.Registration[factory]{reg(typeA, "a/b")}, errText: "must not contain"},
		{name: "space in name", regs: []registry.Registration[factory]{reg(typeA, "a b")}, errText: "must not contain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := registry.New[factory]()
			var err error
			for i, g := range tc.regs {
				err = r.Register(g)
				if err != nil && i < len(tc.regs)-1 {
					t.Fatalf("registration %d (%s): %v", i, g.FullID(), err)
				}
			}
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			case tc.errText != "":
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err = %v, want one containing %q", err, tc.errText)
				}
			case err != nil:
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	r := registry.New[factory]()
	for _, g := range []registry.Registration[factory]{reg(typeA, "zeta"), reg(typeA, "alpha"), reg(typeB, "beta")} {
		if err := r.Register(g); err != nil {
			t.Fatal(err)
		}
	}
	got, err := r.Lookup(typeA, "alpha")
	if err != nil || got.Factory() != "kvtier.test.a.v1/alpha" {
		t.Fatalf("lookup alpha = %v, %v", got.FullID(), err)
	}
	_, err = r.Lookup(typeA, "beta")
	if !errors.Is(err, registry.ErrNotFound) || !strings.Contains(err.Error(), "known: alpha, zeta") {
		t.Fatalf("lookup of a name registered under another type: %v, want ErrNotFound listing alpha, zeta", err)
	}
	if names := r.Names(typeA); strings.Join(names, ",") != "alpha,zeta" {
		t.Fatalf("names = %v, want sorted alpha, zeta", names)
	}
	all := r.All()
	if len(all) != 3 || all[0].FullID() != "kvtier.test.a.v1/alpha" || all[2].FullID() != "kvtier.test.b.v1/beta" {
		t.Fatalf("all = %v, want 3 sorted by full id", all)
	}
	// Registries are values: a second one is independent.
	if _, err := registry.New[factory]().Lookup(typeA, "alpha"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("fresh registry found a registration of another: %v", err)
	}
}

type moduleConfig struct{ Size int }

func defaults() moduleConfig { return moduleConfig{Size: 7} }

func TestConfigAs(t *testing.T) {
	newCfg := registry.NewConfigOf(defaults)
	decoded := newCfg().(*moduleConfig)
	if decoded.Size != 7 {
		t.Fatalf("NewConfigOf gave %+v, want defaults", decoded)
	}
	decoded.Size = 9
	if again := newCfg().(*moduleConfig); again.Size != 7 {
		t.Fatalf("NewConfigOf shares its value between calls: %+v", again)
	}
	var nilPtr *moduleConfig
	for _, tc := range []struct {
		name string
		cfg  any
		want int
		err  bool
	}{
		{"nil", nil, 7, false},
		{"nil pointer", nilPtr, 7, false},
		{"pointer", decoded, 9, false},
		{"value", moduleConfig{Size: 3}, 3, false},
		{"other type", struct{ Size int }{1}, 0, true},
		{"string", "size: 3", 0, true},
	} {
		got, err := registry.ConfigAs("m", tc.cfg, defaults)
		if tc.err {
			if !errors.Is(err, registry.ErrConfigType) || !strings.Contains(err.Error(), "m: config is") {
				t.Errorf("%s: err = %v, want ErrConfigType naming the module", tc.name, err)
			}
			continue
		}
		if err != nil || got.Size != tc.want {
			t.Errorf("%s: ConfigAs = %+v, %v; want size %d", tc.name, got, err, tc.want)
		}
	}
}
