package crc32c

import "golang.org/x/sys/cpu"

var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasSSE42

// foldAVX512 returns the CRC-32C state (not inverted) after p, starting
// from state crc. len(p) must be at least 256 and a multiple of 64.
//
//go:noescape
func foldAVX512(crc uint32, p []byte) uint32

func fold(crc uint32, p []byte) uint32 { return foldAVX512(crc, p) }

// copyFoldAVX512 is foldAVX512 over src that also copies src into dst
// (len(dst) >= len(src)), one pass over the bytes.
//
//go:noescape
func copyFoldAVX512(crc uint32, dst, src []byte) uint32

func copyFold(crc uint32, dst, src []byte) uint32 { return copyFoldAVX512(crc, dst, src) }

// copyFoldNTAVX512 is copyFoldAVX512 with non-temporal stores; dst must be
// 64-byte aligned. It ends with a store fence.
//
//go:noescape
func copyFoldNTAVX512(crc uint32, dst, src []byte) uint32

func copyFoldNT(crc uint32, dst, src []byte) uint32 { return copyFoldNTAVX512(crc, dst, src) }
