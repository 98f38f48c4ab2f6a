package herald

import "encoding/json"

// TagFilter is a subscription's tag filter (subscribe param tf; docs/protocol.md, "Tags and tag
// filters"). A leaf compares one tag: Key, Cmp ("eq", "neq", "in", "nin", "ex", "nex", "starts",
// "ends", "contains", "lt", "lte", "gt", "gte") and Val, or Vals for "in"/"nin". An inner node
// combines its Nodes with Op ("and", "or", "not"). The server checks the grammar (error 107).
type TagFilter struct {
	Key   string      `json:"key,omitempty"`
	Cmp   string      `json:"cmp,omitempty"`
	Val   string      `json:"val,omitempty"`
	Vals  []string    `json:"vals,omitempty"`
	Op    string      `json:"op,omitempty"`
	Nodes []TagFilter `json:"nodes,omitempty"`
}

// MarshalJSON writes every field that is set, so that the server judges the shape (a node mixing
// a leaf's and an inner node's fields is refused with 107, not silently cut down). Go's zero
// values need two rules: an empty Val is sent where a leaf's comparison takes one (eq "" is a real
// filter) and left out for "ex", "nex", "in" and "nin"; "vals" and "nodes" are sent, [] if nil,
// for "in"/"nin" leaves and inner nodes.
func (f TagFilter) MarshalJSON() ([]byte, error) {
	out := map[string]any{}
	leaf := f.Op == ""
	if f.Key != "" || leaf {
		out["key"] = f.Key
	}
	if f.Cmp != "" || leaf {
		out["cmp"] = f.Cmp
	}
	switch {
	case f.Val != "":
		out["val"] = f.Val
	case leaf && f.Cmp != "ex" && f.Cmp != "nex" && f.Cmp != "in" && f.Cmp != "nin":
		out["val"] = ""
	}
	if f.Vals != nil || (leaf && (f.Cmp == "in" || f.Cmp == "nin")) {
		out["vals"] = nonNil(f.Vals)
	}
	if f.Op != "" {
		out["op"] = f.Op
	}
	if f.Nodes != nil || !leaf {
		nodes := f.Nodes
		if nodes == nil {
			nodes = []TagFilter{}
		}
		out["nodes"] = nodes
	}
	return json.Marshal(out)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
