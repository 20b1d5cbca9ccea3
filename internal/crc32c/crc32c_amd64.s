#include "textflag.h"

// Carry-less folding of CRC-32C (reflected, polynomial 0x1EDC6F41), after
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" (Intel)
// and hash/crc32's ieeeCLMUL. Each 128-bit lane A is folded D bits ahead
// as clmul(A.lo, k1) ^ clmul(A.hi, k2) with k1 = reflect(x^(D+32) mod P)<<1
// and k2 = reflect(x^(D-32) mod P)<<1. The last 128-bit lane, which has
// the same remainder as the whole input, is reduced with the CRC32
// instruction instead of a Barrett reduction.

// func foldAVX512(crc uint32, p []byte) uint32
TEXT ·foldAVX512(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX

	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VMOVQ     AX, X10            // zeroes the rest of Z10
	VPXORQ    Z10, Z1, Z1        // the initial state goes into the first 4 bytes
	ADDQ      $256, SI
	SUBQ      $256, CX

	VMOVDQU64 k2048<>+0(SB), Z0
	CMPQ      CX, $256
	JB        fold4

loop256:
	VMOVDQU64  0(SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x00, Z0, Z2, Z2
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x00, Z0, Z3, Z3
	VPCLMULQDQ $0x11, Z0, Z4, Z8
	VPCLMULQDQ $0x00, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z1
	VPTERNLOGD $0x96, Z12, Z6, Z2
	VPTERNLOGD $0x96, Z13, Z7, Z3
	VPTERNLOGD $0x96, Z14, Z8, Z4
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop256

fold4:
	// Fold the four 64-byte accumulators into Z4, 512 bits at a time.
	VMOVDQU64  k512<>+0(SB), Z0
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z5, Z1, Z2
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x00, Z0, Z2, Z2
	VPTERNLOGD $0x96, Z6, Z2, Z3
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x00, Z0, Z3, Z3
	VPTERNLOGD $0x96, Z7, Z3, Z4

loop64:
	CMPQ       CX, $64
	JB         lanes
	VMOVDQU64  0(SI), Z11
	VPCLMULQDQ $0x11, Z0, Z4, Z5
	VPCLMULQDQ $0x00, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z4
	ADDQ       $64, SI
	SUBQ       $64, CX
	JMP        loop64

lanes:
	// Fold the four 128-bit lanes of Z4 into X7, 128 bits at a time.
	VEXTRACTI32X4 $1, Z4, X5
	VEXTRACTI32X4 $2, Z4, X6
	VEXTRACTI32X4 $3, Z4, X7
	VMOVDQU       k128<>+0(SB), X0
	VPCLMULQDQ    $0x11, X0, X4, X8
	VPCLMULQDQ    $0x00, X0, X4, X4
	VPXOR         X8, X4, X4
	VPXOR         X4, X5, X5
	VPCLMULQDQ    $0x11, X0, X5, X8
	VPCLMULQDQ    $0x00, X0, X5, X5
	VPXOR         X8, X5, X5
	VPXOR         X5, X6, X6
	VPCLMULQDQ    $0x11, X0, X6, X8
	VPCLMULQDQ    $0x00, X0, X6, X6
	VPXOR         X8, X6, X6
	VPXOR         X6, X7, X7

	// The CRC-32C state of the 16 bytes of X7 from state 0.
	VMOVQ   X7, AX
	VPEXTRQ $1, X7, BX
	VZEROUPPER
	XORL    DX, DX
	CRC32Q  AX, DX
	CRC32Q  BX, DX
	MOVL    DX, ret+32(FP)
	RET

// func copyFoldAVX512(crc uint32, dst, src []byte) uint32
//
// foldAVX512 over src that also stores every 64-byte block it loads into
// dst at the same offset: the copy and the checksum in one pass over src.
TEXT ·copyFoldAVX512(SB), NOSPLIT, $0-60
	MOVL crc+0(FP), AX
	MOVQ dst_base+8(FP), DI
	MOVQ src_base+32(FP), SI
	MOVQ src_len+40(FP), CX

	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VMOVDQU64 Z1, 0(DI)
	VMOVDQU64 Z2, 64(DI)
	VMOVDQU64 Z3, 128(DI)
	VMOVDQU64 Z4, 192(DI)
	VMOVQ     AX, X10            // zeroes the rest of Z10
	VPXORQ    Z10, Z1, Z1        // the initial state goes into the first 4 bytes
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX

	VMOVDQU64 k2048<>+0(SB), Z0
	CMPQ      CX, $256
	JB        cfold4

cloop256:
	VMOVDQU64  0(SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	VMOVDQU64  Z11, 0(DI)
	VMOVDQU64  Z12, 64(DI)
	VMOVDQU64  Z13, 128(DI)
	VMOVDQU64  Z14, 192(DI)
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x00, Z0, Z2, Z2
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x00, Z0, Z3, Z3
	VPCLMULQDQ $0x11, Z0, Z4, Z8
	VPCLMULQDQ $0x00, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z1
	VPTERNLOGD $0x96, Z12, Z6, Z2
	VPTERNLOGD $0x96, Z13, Z7, Z3
	VPTERNLOGD $0x96, Z14, Z8, Z4
	ADDQ       $256, SI
	ADDQ       $256, DI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        cloop256

cfold4:
	// Fold the four 64-byte accumulators into Z4, 512 bits at a time.
	VMOVDQU64  k512<>+0(SB), Z0
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z5, Z1, Z2
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x00, Z0, Z2, Z2
	VPTERNLOGD $0x96, Z6, Z2, Z3
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x00, Z0, Z3, Z3
	VPTERNLOGD $0x96, Z7, Z3, Z4

cloop64:
	CMPQ       CX, $64
	JB         clanes
	VMOVDQU64  0(SI), Z11
	VMOVDQU64  Z11, 0(DI)
	VPCLMULQDQ $0x11, Z0, Z4, Z5
	VPCLMULQDQ $0x00, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z4
	ADDQ       $64, SI
	ADDQ       $64, DI
	SUBQ       $64, CX
	JMP        cloop64

clanes:
	// Fold the four 128-bit lanes of Z4 into X7, 128 bits at a time.
	VEXTRACTI32X4 $1, Z4, X5
	VEXTRACTI32X4 $2, Z4, X6
	VEXTRACTI32X4 $3, Z4, X7
	VMOVDQU       k128<>+0(SB), X0
	VPCLMULQDQ    $0x11, X0, X4, X8
	VPCLMULQDQ    $0x00, X0, X4, X4
	VPXOR         X8, X4, X4
	VPXOR         X4, X5, X5
	VPCLMULQDQ    $0x11, X0, X5, X8
	VPCLMULQDQ    $0x00, X0, X5, X5
	VPXOR         X8, X5, X5
	VPXOR         X5, X6, X6
	VPCLMULQDQ    $0x11, X0, X6, X8
	VPCLMULQDQ    $0x00, X0, X6, X6
	VPXOR         X8, X6, X6
	VPXOR         X6, X7, X7

	// The CRC-32C state of the 16 bytes of X7 from state 0.
	VMOVQ   X7, AX
	VPEXTRQ $1, X7, BX
	VZEROUPPER
	XORL    DX, DX
	CRC32Q  AX, DX
	CRC32Q  BX, DX
	MOVL    DX, ret+56(FP)
	RET

// func copyFoldNTAVX512(crc uint32, dst, src []byte) uint32
//
// copyFoldAVX512 with non-temporal stores (dst 64-byte aligned), ending
// with a store fence.
TEXT ·copyFoldNTAVX512(SB), NOSPLIT, $0-60
	MOVL crc+0(FP), AX
	MOVQ dst_base+8(FP), DI
	MOVQ src_base+32(FP), SI
	MOVQ src_len+40(FP), CX

	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VMOVNTDQ  Z1, 0(DI)
	VMOVNTDQ  Z2, 64(DI)
	VMOVNTDQ  Z3, 128(DI)
	VMOVNTDQ  Z4, 192(DI)
	VMOVQ     AX, X10            // zeroes the rest of Z10
	VPXORQ    Z10, Z1, Z1        // the initial state goes into the first 4 bytes
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX

	VMOVDQU64 k2048<>+0(SB), Z0
	CMPQ      CX, $256
	JB        nfold4

nloop256:
	VMOVDQU64  0(SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	VMOVNTDQ   Z11, 0(DI)
	VMOVNTDQ   Z12, 64(DI)
	VMOVNTDQ   Z13, 128(DI)
	VMOVNTDQ   Z14, 192(DI)
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x00, Z0, Z2, Z2
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x00, Z0, Z3, Z3
	VPCLMULQDQ $0x11, Z0, Z4, Z8
	VPCLMULQDQ $0x00, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z1
	VPTERNLOGD $0x96, Z12, Z6, Z2
	VPTERNLOGD $0x96, Z13, Z7, Z3
	VPTERNLOGD $0x96, Z14, Z8, Z4
	ADDQ       $256, SI
	ADDQ       $256, DI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        nloop256

nfold4:
	// Fold the four 64-byte accumulators into Z4, 512 bits at a time.
	VMOVDQU64  k512<>+0(SB), Z0
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z5, Z1, Z2
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x00, Z0, Z2, Z2
	VPTERNLOGD $0x96, Z6, Z2, Z3
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x00, Z0, Z3, Z3
	VPTERNLOGD $0x96, Z7, Z3, Z4

nloop64:
	CMPQ       CX, $64
	JB         nlanes
	VMOVDQU64  0(SI), Z11
	VMOVNTDQ   Z11, 0(DI)
	VPCLMULQDQ $0x11, Z0, Z4, Z5
	VPCLMULQDQ $0x00, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z4
	ADDQ       $64, SI
	ADDQ       $64, DI
	SUBQ       $64, CX
	JMP        nloop64

nlanes:
	// Fold the four 128-bit lanes of Z4 into X7, 128 bits at a time.
	VEXTRACTI32X4 $1, Z4, X5
	VEXTRACTI32X4 $2, Z4, X6
	VEXTRACTI32X4 $3, Z4, X7
	VMOVDQU       k128<>+0(SB), X0
	VPCLMULQDQ    $0x11, X0, X4, X8
	VPCLMULQDQ    $0x00, X0, X4, X4
	VPXOR         X8, X4, X4
	VPXOR         X4, X5, X5
	VPCLMULQDQ    $0x11, X0, X5, X8
	VPCLMULQDQ    $0x00, X0, X5, X5
	VPXOR         X8, X5, X5
	VPXOR         X5, X6, X6
	VPCLMULQDQ    $0x11, X0, X6, X8
	VPCLMULQDQ    $0x00, X0, X6, X6
	VPXOR         X8, X6, X6
	VPXOR         X6, X7, X7

	// The CRC-32C state of the 16 bytes of X7 from state 0.
	VMOVQ   X7, AX
	VPEXTRQ $1, X7, BX
	VZEROUPPER
	SFENCE
	XORL    DX, DX
	CRC32Q  AX, DX
	CRC32Q  BX, DX
	MOVL    DX, ret+56(FP)
	RET

// k2048: folds 2048 bits (four 64-byte lanes) ahead.
DATA k2048<>+0(SB)/8, $0xdcb17aa4
DATA k2048<>+8(SB)/8, $0xb9e02b86
DATA k2048<>+16(SB)/8, $0xdcb17aa4
DATA k2048<>+24(SB)/8, $0xb9e02b86
DATA k2048<>+32(SB)/8, $0xdcb17aa4
DATA k2048<>+40(SB)/8, $0xb9e02b86
DATA k2048<>+48(SB)/8, $0xdcb17aa4
DATA k2048<>+56(SB)/8, $0xb9e02b86
GLOBL k2048<>(SB), RODATA, $64

// k512: folds 512 bits ahead.
DATA k512<>+0(SB)/8, $0x740eef02
DATA k512<>+8(SB)/8, $0x9e4addf8
DATA k512<>+16(SB)/8, $0x740eef02
DATA k512<>+24(SB)/8, $0x9e4addf8
DATA k512<>+32(SB)/8, $0x740eef02
DATA k512<>+40(SB)/8, $0x9e4addf8
DATA k512<>+48(SB)/8, $0x740eef02
DATA k512<>+56(SB)/8, $0x9e4addf8
GLOBL k512<>(SB), RODATA, $64

// k128: folds 128 bits ahead.
DATA k128<>+0(SB)/8, $0xf20c0dfe
DATA k128<>+8(SB)/8, $0x14cd00bd6
GLOBL k128<>(SB), RODATA, $16
