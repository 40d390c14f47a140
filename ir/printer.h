// The text IR printer: renders a Graph as readable TorchScript-like text that parseGraph
// (ir/parser.h) reads back exactly. The grammar is documented in ir/parser.h.
#pragma once

#include <string>
#include <string_view>

#include "ir/graph.h"

namespace kiln::ir {

// Prints the whole graph. Only attributes set on a node are printed (schema defaults are
// not), parameters print their type but never their data, and the output is canonical:
// printGraph(parseGraph(printGraph(g))) == printGraph(g), byte for byte. Graphs that do not
// verify still print, so that a broken pass can be dumped.
std::string printGraph(const Graph& g);

// One attribute value in text IR syntax: 3, 0.5, "none", [1,2], [0.5,1.0], f32[2] 0x...
std::string printAttrValue(const AttrValue& v);

// The shortest text that reads back as the same double, always recognisable as a float
// literal ("1.0", "1e-05", "-inf", "nan"). NaNs other than the two default quiet NaNs print
// their bits, e.g. "nan(0x7ff0000000000001)".
std::string printFloat(double v);

// A string literal with quotes; ", \ and control bytes are escaped.
std::string quoteString(std::string_view s);

}  // namespace kiln::ir
