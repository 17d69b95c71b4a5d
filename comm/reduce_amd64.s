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
