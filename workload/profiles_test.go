package workload

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// TestProfiles checks that every profile generates a valid, prefix-chained
// trace that survives a Write/read round trip, deterministically.
func TestProfiles(t *testing.T) {
	for _, p := range Profiles() {
		t.Run(p.Name, func(t *testing.T) {
			c := p.Config(5)
			c.Requests = 4000
			reqs, err := Generate(c)
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckChains(reqs); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := Write(&buf, reqs); err != nil {
				t.Fatal(err)
			}
			back, err := NewReader(&buf, p.Name).ReadAll()
			if err != nil || !reflect.DeepEqual(back, reqs) {
				t.Fatalf("round trip: %v", err)
			}
			again, _ := Generate(c)
			if !reflect.DeepEqual(again, reqs) {
				t.Fatal("same seed gave different workloads")
			}
		})
	}
	if _, err := ProfileByName("nope"); err == nil {
		t.Error("ProfileByName accepted an unknown name")
	}
	if p, err := ProfileByName("default"); err != nil || !reflect.DeepEqual(p.Config(1), DefaultGeneratorConfig()) {
		t.Errorf("the default profile is not DefaultGeneratorConfig: %v", err)
	}
}

// TestKnobs checks what each knob models: documents asked about again
// behind the same document blocks, conversations back after long idle
// gaps, agent steps that extend the previous step by its answer and a tool
// result.
func TestKnobs(t *testing.T) {
	c := MixedConfig(9)
	c.Requests = 6000
	reqs, metas, err := generate(c)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		k    kind
		conv int
	}
	last := map[key]int{}
	var docAgain, longIdle, agentSteps int
	for i, m := range metas {
		switch m.kind {
		case kindDocument:
			if m.turn > 0 {
				docAgain++
			}
		case kindChat, kindAgent:
			k := key{m.kind, m.conv}
			j, ok := last[k]
			last[k] = i
			if !ok {
				continue
			}
			prev, cur := reqs[j], reqs[i]
			least := cfgMin(c, m.kind)
			if cur.InputLength < prev.InputLength+prev.OutputLength+least {
				t.Fatalf("request %d: input %d does not extend previous input %d + output %d", i, cur.InputLength, prev.InputLength, prev.OutputLength)
			}
			full := prev.InputLength / BlockTokens
			if !reflect.DeepEqual(cur.HashIDs[:full], prev.HashIDs[:full]) {
				t.Fatalf("request %d: the previous step's full blocks are not a prefix", i)
			}
			if m.kind == kindAgent {
				agentSteps++
			} else if i-j > 1000 {
				longIdle++
			}
		}
	}
	if docAgain < 200 || longIdle < 50 || agentSteps < 500 {
		t.Fatalf("knobs barely show: %d repeated document questions, %d idle returns, %d agent steps", docAgain, longIdle, agentSteps)
	}
}

func cfgMin(c GeneratorConfig, k kind) int {
	if k == kindAgent {
		return c.ToolTokens.Min
	}
	return c.UserTokens.Min
}

func TestKnobsValidate(t *testing.T) {
	for _, tc := range []struct {
		field  string
		mutate func(*GeneratorConfig)
	}{
		{"Mix.Agent", func(c *GeneratorConfig) { c.Mix.Agent = -1 }},
		{"ActiveDocuments", func(c *GeneratorConfig) { c.ActiveDocuments = -1 }},
		{"DocumentQuestions", func(c *GeneratorConfig) { c.ActiveDocuments, c.DocumentQuestions = 4, 0.5 }},
		{"IdleShare", func(c *GeneratorConfig) { c.IdleShare = 1.5 }},
		{"IdleRequests", func(c *GeneratorConfig) { c.IdleShare, c.IdleRequests = 0.1, 0 }},
		{"ActiveAgents", func(c *GeneratorConfig) { c.Mix.Agent, c.ActiveAgents = 1, 0 }},
		{"AgentSteps", func(c *GeneratorConfig) { c.Mix.Agent, c.ActiveAgents, c.AgentSteps = 1, 1, 0 }},
		{"ToolTokens", func(c *GeneratorConfig) {
			c.Mix.Agent, c.ActiveAgents, c.AgentSteps, c.AgentOutputTokens = 1, 1, 2, Range{1, 1}
		}},
	} {
		c := DefaultGeneratorConfig()
		tc.mutate(&c)
		_, err := Generate(c)
		if err == nil || !errors.Is(err, ErrBadGeneratorConfig) || !bytes.Contains([]byte(err.Error()), []byte(tc.field+":")) {
			t.Errorf("%s: got %v, want an ErrBadGeneratorConfig naming the field", tc.field, err)
		}
	}
}
