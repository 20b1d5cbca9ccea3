package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name, in, out, err string
	}{
		{name: "doc vector", in: "2 " + strings.Repeat("00", 32) + " 1 2 3 4 5\n",
			out: "e7ca17d6581d126af7e0c8574cdd8987ed93319969b54a5e2a272d585a38f3ea a9edfe541f21e65d5b60b9415fa27b3f4f5719355cfb89fe6027548c9d21d5dd\n"},
		{name: "no whole page", in: "8 " + strings.Repeat("00", 32) + " 7 7 7\n", out: "-\n"},
		{name: "short line", in: "8\n", err: "line 1: want PAGE_TOKENS PREV_HEX TOKEN..."},
		{name: "bad page size", in: "0 " + strings.Repeat("00", 32) + "\n", err: `line 1: page_tokens "0"`},
		{name: "bad prev", in: "1 abc 1\n", err: "line 1: page hash"},
		{name: "bad token", in: "1 " + strings.Repeat("00", 32) + " 4294967296\n", err: "line 1: token 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(strings.NewReader(tt.in), &out)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || out.String() != tt.out {
				t.Fatalf("got %q, %v; want %q", out.String(), err, tt.out)
			}
		})
	}
}

// FuzzRun: any input gives output or an error naming a line, never a panic.
func FuzzRun(f *testing.F) {
	f.Add("2 " + strings.Repeat("00", 32) + " 1 2 3 4 5\n")
	f.Add("1 zz 1\n\n3")
	f.Fuzz(func(t *testing.T, in string) {
		var out bytes.Buffer
		if err := run(strings.NewReader(in), &out); err != nil && !strings.Contains(err.Error(), "line ") && !strings.Contains(err.Error(), "token too long") {
			t.Fatalf("error without a line: %v", err)
		}
	})
}
