// The text IR parser: reads what printGraph (ir/printer.h) writes, plus hand-written IR in
// tests, and returns a verified Graph or an error with line:column. Never aborts on input.
#pragma once

#include <string_view>

#include "ir/graph.h"

namespace kiln::ir {

// Grammar (tokens are separated by any whitespace; '#' comments run to the end of a line):
//
//   graph     := 'graph' (ident | string) '(' [typed (',' typed)*] ')' '{' stmt* ret '}'
//   typed     := '%'name ':' type
//   type      := dtype '[' [dim (',' dim)*] ']' ['@' ('nchw' | 'nhwc' | 'plain')]
//   stmt      := 'param' typed ['buffer']                  (buffer: not trainable)
//              | [out (',' out)* '='] op '(' [ref (',' ref)*] ')'
//                ['{' [ident '=' value (',' ident '=' value)*] '}'] ['name' '=' string]
//   out       := '%'name [':' type]                         (a type left out is inferred)
//   ret       := 'return' ref (',' ref)*
//   ref       := '%'name                                    (defined earlier in the text)
//
// Value names use letters, digits and _ . - / : (Graph::isValidName). An attribute's kind
// comes from the op's schema in ops.def, so `[]` is unambiguous. Values by kind:
//   int 3 | float 0.5 1e-05 -inf nan (an integer is accepted) | string "a\"b\n\x01" |
//   ints [1,2] | floats [0.5,1.0] | tensor f32[2] 0x0000803f00000040 (bytes in memory order).
//
// Output types as written are kept (layout included) and checked against shape inference;
// the finished graph then passes ir::verify. Parameters carry no data.
Expected<Graph> parseGraph(std::string_view text);

// One tensor type, e.g. "f32[1,64,56,56]@nhwc".
Expected<TensorType> parseType(std::string_view text);

// One attribute value of the given kind, in the syntax printAttrValue writes.
Expected<AttrValue> parseAttrValue(std::string_view text, AttrKind kind);

}  // namespace kiln::ir
