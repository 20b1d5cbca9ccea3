package stack

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/plugins/pluginhost"
)

func TestFromConfig(t *testing.T) {
	sum := strings.Repeat("a", 64)
	opts := pluginhost.Options{CallTimeout: time.Second}
	cases := []struct {
		name string
		in   config.PluginSpec
		// wantConfig is the YAML passed on, nil for none.
		wantConfig []byte
	}{
		{"with config", config.PluginSpec{Path: "/p", SHA256: sum, Config: []byte("capacity: 1\n")}, []byte("capacity: 1\n")},
		{"without config", config.PluginSpec{Path: "bin/p", SHA256: sum}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := FromConfig("l4", tc.in, opts)
			if spec.Name != "l4" || spec.Path != tc.in.Path || spec.SHA256 != sum || spec.Options.String() != opts.String() {
				t.Fatalf("FromConfig = %+v", spec)
			}
			switch c := spec.Config.(type) {
			case nil:
				if tc.wantConfig != nil {
					t.Fatalf("config nil, want %q", tc.wantConfig)
				}
			case []byte:
				if !bytes.Equal(c, tc.wantConfig) {
					t.Fatalf("config %q, want %q", c, tc.wantConfig)
				}
			default:
				t.Fatalf("config of type %T, want []byte (YAML) or nil", c)
			}
			if err := spec.Validate(); err != nil {
				t.Fatalf("spec from a loaded config does not validate: %v", err)
			}
		})
	}
}
