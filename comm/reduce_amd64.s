#include "textflag.h"

// Float32 sums of 2, 3 or 4 sources, 8 elements (one AVX2 register) per
// step, with the association of op2/op3/op4 in reduce.go — (a+b), (a+b)+c,
// (a+b)+(c+e) — so the results are bit-identical to the Go loops. n is a
// multiple of 8; the caller does the rest.

// func sum2F32(d, a, b *float32, n int)
TEXT ·sum2F32(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ n+24(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
loop2:
	CMPQ AX, CX
	JAE  done2
	VMOVUPS (SI)(AX*1), Y0
	VADDPS  (R8)(AX*1), Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP  loop2
done2:
	VZEROUPPER
	RET

// func sum3F32(d, a, b, c *float32, n int)
TEXT ·sum3F32(SB), NOSPLIT, $0-40
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ c+24(FP), R9
	MOVQ n+32(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
loop3:
	CMPQ AX, CX
	JAE  done3
	VMOVUPS (SI)(AX*1), Y0
	VADDPS  (R8)(AX*1), Y0, Y0
	VADDPS  (R9)(AX*1), Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP  loop3
done3:
	VZEROUPPER
	RET

// func sum4F32(d, a, b, c, e *float32, n int)
TEXT ·sum4F32(SB), NOSPLIT, $0-48
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ c+24(FP), R9
	MOVQ e+32(FP), R10
	MOVQ n+40(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
loop4:
	CMPQ AX, CX
	JAE  done4
	VMOVUPS (SI)(AX*1), Y0
	VADDPS  (R8)(AX*1), Y0, Y0
	VMOVUPS (R9)(AX*1), Y1
	VADDPS  (R10)(AX*1), Y1, Y1
	VADDPS  Y1, Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP  loop4
done4:
	VZEROUPPER
	RET

// func ntCopy(d, s *byte, n int)
// Copies n bytes (a multiple of 64) from s to d (16-byte aligned) with
// non-temporal stores (MOVNTDQ): the lines go to memory without being read
// first and without staying in the cache. SFENCE orders them before any
// later store (the flag that publishes them).
TEXT ·ntCopy(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
loopnt:
	CMPQ AX, CX
	JAE  donent
	MOVOU (SI)(AX*1), X0
	MOVOU 16(SI)(AX*1), X1
	MOVOU 32(SI)(AX*1), X2
	MOVOU 48(SI)(AX*1), X3
	MOVNTO X0, (DI)(AX*1)
	MOVNTO X1, 16(DI)(AX*1)
	MOVNTO X2, 32(DI)(AX*1)
	MOVNTO X3, 48(DI)(AX*1)
	ADDQ $64, AX
	JMP  loopnt
donent:
	SFENCE
	RET
