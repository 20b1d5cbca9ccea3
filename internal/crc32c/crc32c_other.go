//go:build !amd64

package crc32c

const haveFold = false

func fold(crc uint32, p []byte) uint32 { panic("crc32c: no folding on this architecture") }

func copyFold(crc uint32, dst, src []byte) uint32 { panic("crc32c: no folding on this architecture") }

func copyFoldNT(crc uint32, dst, src []byte) uint32 { panic("crc32c: no folding on this architecture") }
