// MLIR's parser recurses once per nesting level: 20,000 levels overflowed the
// 8 MiB main-thread stack and killed the drivers with a signal. They run on a
// 1 GiB stack (epic/Support/LargeStack.h) and answer: the IR, or a diagnostic.
// RUN: python3 -c "d = 20000; print('func.func private @f() attributes {a = ' + '[' * d + '1' + ']' * d + '}')" | epic-opt - | FileCheck %s
// RUN: python3 -c "d = 20000; print('func.func private @f() attributes {a = ' + '[' * d + '1' + ']' * (d - 1) + '}')" | not epic-opt - 2>&1 | FileCheck %s --check-prefix=ERR
// RUN: python3 -c "d = 20000; print('func.func private @f() attributes {a = ' + '[' * d + '1' + ']' * d + '}')" | not epic-compile - --no-cubin -o %t 2>&1 | FileCheck %s --check-prefix=COMPILE

// CHECK: func.func private @f() attributes {a = {{\[+}}1{{\]+}}}
// ERR: error: expected ',' or ']'
// COMPILE: epic-compile: - has no gpu.func kernel to compile
