package l2hugetlb_test

import (
	"strings"
	"testing"

	"github.com/kvtier/kvtier/host/config"
	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/policy/adaptive"
	"github.com/kvtier/kvtier/quantity"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l2hugetlb"
)

// TestStackConfig decodes the l2hugetlb block of a stack YAML through the
// host's config loader: units, defaults, strict fields and Validate.
func TestStackConfig(t *testing.T) {
	tr := tiers.NewRegistry()
	if err := l2hugetlb.Register(tr); err != nil {
		t.Fatal(err)
	}
	pr := policy.NewRegistry()
	if err := adaptive.Register(pr); err != nil { // the default policy
		t.Fatal(err)
	}
	m := config.Modules{Tiers: tr, Indexes: indexes.NewRegistry(), Policies: pr}
	stack := func(block string) string {
		return "version: 1\nmodel:\n  page_tokens: 64\n  payloads: [{name: kv, page_bytes: 2.75MiB}]\ntiers:\n  - name: l2\n    role: slab\n    use: l2hugetlb\n    config: " + block + "\n"
	}
	tests := []struct {
		block   string
		want    l2hugetlb.Config
		wantErr string
	}{
		{block: "{size: 64GiB}", want: func() l2hugetlb.Config { c := l2hugetlb.DefaultConfig(); c.Size = 64 * quantity.GiB; return c }()},
		{block: "{size: 1.5TiB, max_slab: 400GiB, fallback: shm, stale: remove, populate: true, mlock: true, name: prod, mount: /mnt/huge, shm_dir: /run/shm}",
			want: l2hugetlb.Config{Size: 1536 * quantity.GiB, MaxSlab: 400 * quantity.GiB, Fallback: l2hugetlb.FallbackShm, Stale: l2hugetlb.StaleRemove,
				Populate: true, Mlock: true, Name: "prod", Mount: "/mnt/huge", ShmDir: "/run/shm"}},
		{block: "{size: 64GiB, fallbak: shm}", wantErr: "fallbak"},
		{block: "{}", wantErr: "size must be set"},
		{block: "{size: 64GiB, stale: keep}", wantErr: "stale"},
		{block: "{size: 64G}", wantErr: `unknown unit "G"`},
	}
	for _, tt := range tests {
		st, err := config.Load([]byte(stack(tt.block)), "stack.yaml", m)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "stack.yaml") {
				t.Errorf("config %s: error %v, want one naming the file and %q", tt.block, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("config %s: %v", tt.block, err)
			continue
		}
		got, ok := st.Tiers[0].Config.(*l2hugetlb.Config)
		if !ok || *got != tt.want {
			t.Errorf("config %s decoded to %+v, want %+v", tt.block, st.Tiers[0].Config, tt.want)
		}
	}
}
