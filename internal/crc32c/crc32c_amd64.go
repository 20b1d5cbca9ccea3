package crc32c

import "golang.org/x/sys/cpu"

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasSSE42

// foldAVX512 returns the CRC-32C state (not inverted) after p, starting
// from state crc. len(p) must be at least 256 and a multiple of 64.
//
//go:noescape
func foldAVX512(crc uint32, p []byte) uint32

func fold(crc uint32, p []byte) uint32 { return foldAVX512(crc, p) }
