package plugins

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc"
)

func TestVersionsRoundTrip(t *testing.T) {
	cases := []struct {
		in   string
		want []int
		bad  bool
	}{
		{"1", []int{1}, false},
		{"3,1,2", []int{1, 2, 3}, false},
		{" 2 , 1 ,", []int{1, 2}, false},
		{"", nil, false},
		{"1,x", nil, true},
	}
	for _, c := range cases {
		got, err := ParseVersions(c.in)
		if (err != nil) != c.bad || (!c.bad && !slices.Equal(got, c.want)) {
			t.Errorf("ParseVersions(%q) = %v, %v; want %v (bad %v)", c.in, got, err, c.want, c.bad)
		}
	}
	if s := FormatVersions([]int{1, 2}); s != "1,2" {
		t.Errorf("FormatVersions = %q", s)
	}
	if v := Versions(); len(v) == 0 || v[len(v)-1] != ProtocolVersion1 {
		t.Errorf("Versions() = %v", v)
	}
	sets := HostPluginSets()
	if _, ok := sets[ProtocolVersion1][StoreService]; !ok {
		t.Errorf("host plugin sets lack the store service: %v", sets)
	}
	if _, ok := sets[ProtocolVersion1][IndexService]; !ok {
		t.Errorf("host plugin sets lack the index service: %v", sets)
	}
	if h := Handshake(); h.MagicCookieKey == "" || h.MagicCookieValue == "" {
		t.Errorf("handshake %+v", h)
	}
}

func TestGRPCService(t *testing.T) {
	registered := false
	p := &GRPCService{Register: func(*grpc.Server) { registered = true }}
	if err := p.GRPCServer(nil, grpc.NewServer()); err != nil || !registered {
		t.Fatalf("GRPCServer: %v, registered %v", err, registered)
	}
	ctx, cancel := context.WithCancel(context.Background())
	raw, err := (&GRPCService{}).GRPCClient(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := raw.(*Conn)
	if !ok || c.Exited != ctx {
		t.Fatalf("GRPCClient dispensed %T", raw)
	}
	cancel()
	if c.Exited.Err() == nil {
		t.Fatal("exit context not propagated")
	}
}

func FuzzParseVersions(f *testing.F) {
	for _, s := range []string{"1", "1,2,3", "", ",,", "-1", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		vs, err := ParseVersions(s)
		if err != nil {
			return
		}
		if !slices.IsSorted(vs) {
			t.Fatalf("%q parsed unsorted: %v", s, vs)
		}
		back, err := ParseVersions(FormatVersions(vs))
		if err != nil || !slices.Equal(back, vs) {
			t.Fatalf("%q: round trip %v -> %v, %v", s, vs, back, err)
		}
	})
}
