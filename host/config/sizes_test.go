package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
	"github.com/kvtier/kvtier/tiers/l3disk"
	"github.com/kvtier/kvtier/tiers/memstore"
)

// sizeFields are the size fields of the built-in modules (and the stack's
// own page_bytes), each with the stack that holds it and how to read the
// decoded value back. The line of the field is marked with @ in the YAML.
var sizeFields = []struct {
	name string
	path string
	yaml string
	get  func(*config.Stack) int64
}{
	{
		name: "model page_bytes", path: "$.model.payloads[0].page_bytes",
		yaml: "version: 1\nmodel:\n  page_tokens: 64\n  payloads:\n    - name: kv\n      page_bytes: @\n",
		get:  func(s *config.Stack) int64 { return s.Payload.Kinds[0].PageBytes },
	},
	{
		name: "l2hugetlb size", path: "$.tiers[0].config.size",
		yaml: stackWith("  - name: l2\n    role: slab\n    use: l2hugetlb\n    config:\n      size: @\n"),
		get:  func(s *config.Stack) int64 { return int64(s.Tiers[0].Config.(*l2hugetlb.Config).Size) },
	},
	{
		name: "l2hugetlb max_slab", path: "$.tiers[0].config.max_slab",
		yaml: stackWith("  - name: l2\n    role: slab\n    use: l2hugetlb\n    config:\n      size: 1GiB\n      max_slab: @\n"),
		get:  func(s *config.Stack) int64 { return int64(s.Tiers[0].Config.(*l2hugetlb.Config).MaxSlab) },
	},
	{
		name: "l3disk budget", path: "$.tiers[1].config.disks[0].budget",
		yaml: stackWith("  - name: l2\n    role: slab\n    use: l2hugetlb\n    config: {size: 1GiB}\n  - name: l3\n    role: store\n    use: l3disk\n    index: {use: lmdb}\n    config:\n      disks:\n        - dir: /var/tmp/kv\n          budget: @\n"),
		get:  func(s *config.Stack) int64 { return int64(s.Tiers[1].Config.(*l3disk.Config).Disks[0].Budget) },
	},
	{
		name: "memstore capacity", path: "$.tiers[1].config.capacity",
		yaml: stackWith("  - name: l2\n    role: slab\n    use: l2hugetlb\n    config: {size: 1GiB}\n  - name: mem\n    role: store\n    use: memstore\n    config:\n      capacity: @\n"),
		get:  func(s *config.Stack) int64 { return int64(s.Tiers[1].Config.(*memstore.Config).Capacity) },
	},
}

func stackWith(tiers string) string {
	return "version: 1\nmodel:\n  page_tokens: 64\n  payloads: [{name: kv, page_bytes: 64KiB}]\ntiers:\n" + tiers
}

// TestSizeOneRule feeds the same size strings through every module's config
// and the stack's page_bytes: each is accepted everywhere with the value
// quantity.ParseSize gives, or refused everywhere with an error at the
// field's YAML path and line. (Every accepted value lies in [2MiB, 1GiB],
// which every field allows, so a refusal can only come from parsing.)
func TestSizeOneRule(t *testing.T) {
	m := builtinModules(t)
	for _, in := range []string{
		"4MiB", "4 MiB", "4mib", "4MIB", "2.75MiB", "0.5GiB", "1GiB", "1gb", "4194304", "4000KB", `"8MiB"`, "'8MiB'",
		"1e7", "1E7", "4M", "4 megs", "-4MiB", "4.MiB", ".5GiB", "0.0000001GiB", "NaN", "inf", "0x400000", "4_194_304",
		"[4MiB]", "{a: 1}", "true", "4.5", strings.Repeat("9", 100) + "MiB",
	} {
		text := strings.Trim(in, `"'`)
		want, perr := quantity.ParseSize(text)
		if in == "4.5" || in == "true" || in == "[4MiB]" || in == "{a: 1}" || in == "inf" {
			perr = errors.New("not a size node") // not a string or an integer in YAML
		}
		for _, f := range sizeFields {
			src := strings.Replace(f.yaml, "@", in, 1)
			line := strings.Count(src[:strings.Index(f.yaml, "@")], "\n") + 1
			s, err := config.Load([]byte(src), "sizes.yaml", m)
			if perr != nil {
				var ce *config.Error
				if !errors.As(err, &ce) || ce.Path != f.path || ce.Line != line {
					t.Errorf("%s = %s: got %v; want an error at %s on line %d (ParseSize: %v)", f.name, in, err, f.path, line, perr)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s = %s: %v; want %d bytes", f.name, in, err, want)
				continue
			}
			if got := f.get(s); got != int64(want) {
				t.Errorf("%s = %s: decoded %d bytes, want %d", f.name, in, got, want)
			}
		}
	}
}

// TestSizePrintsBack checks that every module prints its sizes as
// quantity.Size.String does, and that the printed stack loads back.
func TestSizePrintsBack(t *testing.T) {
	m := builtinModules(t)
	for _, f := range sizeFields {
		src := strings.Replace(f.yaml, "@", "2.75MiB", 1)
		s, err := config.Load([]byte(src), "sizes.yaml", m)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		out := s.String()
		if !strings.Contains(out, ": 2.75MiB") {
			t.Errorf("%s: printed stack does not say 2.75MiB:\n%s", f.name, out)
		}
		s2, err := config.Load([]byte(out), "printed.yaml", m)
		if err != nil || f.get(s2) != f.get(s) {
			t.Errorf("%s: printed stack loads to %v, %v", f.name, fmt.Sprint(s2 != nil), err)
		}
	}
}

// TestNonsenseRefused checks that values no machine could serve are
// refused at the offending field's YAML path and line, with the bound in
// the message.
func TestNonsenseRefused(t *testing.T) {
	m := builtinModules(t)
	l2 := func(cfg string) string {
		return stackWith("  - name: l2\n    role: slab\n    use: l2hugetlb\n    config:\n" + cfg)
	}
	l3 := func(disks string) string {
		return stackWith("  - name: l2\n    role: slab\n    use: l2hugetlb\n    config: {size: 1GiB}\n  - name: l3\n    role: store\n    use: l3disk\n    index: {use: lmdb}\n    config:\n      disks:\n" + disks)
	}
	tests := []struct {
		name, yaml, path, want string
	}{
		{"L2 of a million TiB", l2("      size: 1000000TiB #<\n"), "$.tiers[0].config.size", "is more than 64TiB"},
		{"L2 max_slab of 100 TiB", l2("      size: 1GiB\n      max_slab: 100TiB #<\n"), "$.tiers[0].config.max_slab", "is more than 64TiB"},
		{"L2 size missing", l2("      fallback: shm\n"), "$.tiers[0].config.size", "size must be set"}, // at "config:" (line 9)
		{"L2 mount with NUL", l2("      size: 1GiB\n      mount: \"/dev/huge\\0pages\" #<\n"), "$.tiers[0].config.mount", "NUL byte"},
		{"page of 4000 TiB", "version: 1\nmodel:\n  page_tokens: 64\n  payloads:\n    - name: kv\n      page_bytes: 4000TiB #<\n", "$.model.payloads[0].page_bytes", "4000TiB is more than 1GiB"},
		{"dir with NUL", l3("        - {dir: \"/var/tmp/a\\0b\", budget: 1GiB} #<\n"), "$.tiers[1].config.disks[0].dir", "NUL byte"},
		{"two disks, one directory", l3("        - {dir: /var/tmp/kv, budget: 1GiB}\n        - {dir: /var/tmp/kv/, budget: 1GiB} #<\n"), "$.tiers[1].config.disks[1].dir", "repeats disks[0]"},
		{"budget of 2 PiB", l3("        - dir: /var/tmp/kv\n          budget: 2PiB #<\n"), "$.tiers[1].config.disks[0].budget", "unknown unit"},
		{"budget of 2048 TiB", l3("        - dir: /var/tmp/kv\n          budget: 2048TiB #<\n"), "$.tiers[1].config.disks[0].budget", "2048TiB is more than 1024TiB"},
		{"budget zero", l3("        - dir: /var/tmp/kv\n          budget: 0 #<\n"), "$.tiers[1].config.disks[0].budget", "must be positive"},
		{"second disk's budget", l3("        - {dir: /var/tmp/a, budget: 1GiB}\n        - dir: /var/tmp/b\n          budget: 0 #<\n"), "$.tiers[1].config.disks[1].budget", "must be positive"},
		{"memstore of 100 TiB", stackWith("  - name: l2\n    role: slab\n    use: l2hugetlb\n    config: {size: 1GiB}\n  - name: m\n    role: store\n    use: memstore\n    config:\n      capacity: 100TiB #<\n"), "$.tiers[1].config.capacity", "is more than 64TiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load([]byte(tc.yaml), "n.yaml", m)
			line := 9 // no mark: the field is absent, the error is at its block
			for i, l := range strings.Split(tc.yaml, "\n") {
				if strings.Contains(l, "#<") {
					line = i + 1
				}
			}
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Path != tc.path || ce.Line != line || !strings.Contains(ce.Msg, tc.want) {
				t.Fatalf("got %v\nwant an error at %s, line %d, saying %q", err, tc.path, line, tc.want)
			}
		})
	}
}
