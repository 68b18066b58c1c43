package registry

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/argmap"
	"github.com/v0m3/v0m3/internal/redact"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// maxCompositeDepth bounds how deep product objects and arrays are
// compared with remote ones.
const maxCompositeDepth = 8

// bindingShapeViolations checks what can be checked of an argument map
// before anything is looked up: paths parse, and each binding has exactly
// one source.
func bindingShapeViolations(bindings []*registryv1.ArgumentBinding) []apierror.FieldViolation {
	var v []apierror.FieldViolation
	add := func(field, desc string) { v = append(v, apierror.FieldViolation{Field: field, Description: desc}) }
	for i, b := range bindings {
		at := fmt.Sprintf("argument_map[%d]", i)
		if b.GetRemoteField() == "" {
			add(at+".remote_field", "the remote argument is required: a top-level name or a JSON Pointer such as /options/depth")
		} else if _, err := argmap.Parse(b.GetRemoteField()); err != nil {
			add(at+".remote_field", "invalid remote path: "+err.Error())
		}
		switch c := b.GetConstant(); {
		case c != nil && b.GetProductField() != "":
			add(at+".constant", "set either product_field or constant, not both")
		case c != nil && c.GetKind() == nil:
			add(at+".constant", "the constant has no value; a JSON null is null_value")
		case c != nil && b.GetFromHandle():
			add(at+".from_handle", "a constant is not a handle")
		case c == nil && b.GetProductField() == "":
			add(at+".product_field", "the product field name, or a constant, is required")
		case c == nil:
			if _, err := argmap.Parse(b.GetProductField()); err != nil {
				add(at+".product_field", "invalid product path: "+err.Error())
			}
		}
	}
	return v
}

// binding is one argument-map entry under review.
type binding struct {
	at       string // "argument_map[i]"
	remote   argmap.Path
	product  argmap.Path // nil for a constant
	constant *structpb.Value
	handle   bool
	// always: present in every call (a constant, or a product field the
	// product schema requires).
	always bool
	// src is what the binding sends: a handle sends its target, a string.
	src     argmap.Types
	srcNode argmap.Node
	// checked: the product side is valid, so the remote side is checked.
	checked bool
	// refused: its remote path conflicts; later simulations leave it out.
	refused bool
}

// bound stands for a bound value in the simulated remote arguments;
// idem marks the idempotency key field.
type bound struct {
	b    *binding
	idem bool
}

// argCheck reviews one proposal's argument map.
type argCheck struct {
	req  *registryv1.ProposeMappingRequest
	cp   *registryv1.Capability
	tool *registryv1.ToolIdentity
	v    []apierror.FieldViolation
	// who names the proposal field that put each place (a JSON Pointer)
	// into the simulated arguments, for violations found there.
	who map[string]string
}

func (c *argCheck) add(field, format string, a ...any) {
	c.v = append(c.v, apierror.FieldViolation{Field: field, Description: fmt.Sprintf(format, a...)})
}

// validateArgumentMap type-checks a proposal's argument map, defaults and
// idempotency key field against the capability's product input schema
// and, for a tool, the snapshot's remote input schema (local $ref and
// $defs resolved). It builds the remote arguments the map would send, as
// the orchestrator builds them, with each bound value standing in for
// what a call supplies, and refuses what would fail or send something
// unreviewed at call time: a remote path the schema does not declare, a
// value whose type cannot fit, a path bound twice, a gap in an array, a
// required remote field bound by nothing, a constant or default the remote
// schema forbids, and anything that looks like a secret.
func validateArgumentMap(req *registryv1.ProposeMappingRequest, cp *registryv1.Capability, tool *registryv1.ToolIdentity) []apierror.FieldViolation {
	c := &argCheck{req: req, cp: cp, tool: tool, who: map[string]string{}}
	bindings := c.productSide()
	if tool == nil {
		c.resourceRules(bindings)
		return c.v
	}
	c.remoteSide(bindings)
	return c.v
}

// productSide parses each binding and checks its product field against
// the capability's input schema and handle fields.
func (c *argCheck) productSide() []*binding {
	product, perr := argmap.NewSchema(c.cp.GetInputSchema().AsMap()).Root()
	handles := handleFieldNames(c.cp)
	var out []*binding
	for i, ab := range c.req.GetArgumentMap() {
		b := &binding{at: fmt.Sprintf("argument_map[%d]", i), constant: ab.GetConstant()}
		var err error
		if b.remote, err = argmap.Parse(ab.GetRemoteField()); err != nil {
			continue // reported by bindingShapeViolations
		}
		out = append(out, b)
		if b.constant != nil {
			b.always, b.checked, b.src = true, true, argmap.TypeOf(b.constant.AsInterface())
			continue
		}
		if b.product, err = argmap.Parse(ab.GetProductField()); err != nil {
			continue
		}
		if perr != nil {
			c.add(b.at+".product_field", "the input schema of capability %s cannot be read: %v", c.cp.GetName(), perr)
			continue
		}
		node, always, ok := c.productField(product, b)
		if !ok {
			continue
		}
		b.srcNode, b.src, b.always = node, node.Types(), always
		isHandle := len(b.product) == 1 && slices.Contains(handles, b.product[0])
		switch {
		case ab.GetFromHandle() && !isHandle:
			c.add(b.at+".from_handle", "product field %q is a value, not a handle; handle fields of %s: %s", ab.GetProductField(), c.cp.GetName(), strings.Join(handles, ", "))
			continue
		case !ab.GetFromHandle() && isHandle:
			c.add(b.at+".from_handle", "product field %q carries a handle; set from_handle so the remote receives the handle's resolved target, never the handle itself", ab.GetProductField())
			continue
		case isHandle:
			b.handle, b.src = true, argmap.TypeString
		}
		b.checked = true
	}
	return out
}

// productField finds a binding's product field, and whether every call
// carries it (each step required by its parent).
func (c *argCheck) productField(root argmap.Node, b *binding) (argmap.Node, bool, bool) {
	node, always := root, true
	unknown := func() (argmap.Node, bool, bool) {
		c.add(b.at+".product_field", "product field %s is not in the input schema of capability %s (fields: %s)",
			display(b.product), c.cp.GetName(), names(root.FieldNames()))
		return argmap.Node{}, false, false
	}
	for i, tok := range b.product {
		if b.product.Element(i) {
			n, ok := argmap.Index(tok)
			if !ok {
				c.add(b.at+".product_field", "%q appends to an array; a product path names a value that exists, e.g. /tags/0", tok)
				return argmap.Node{}, false, false
			}
			el, isArray, err := node.Element(n)
			if err != nil || !isArray || el.Impossible() {
				return unknown()
			}
			// An element is always there only when the array must be
			// longer than its index.
			bounds := node.ItemBounds()
			always = always && len(bounds) > 0 && !slices.ContainsFunc(bounds, func(b argmap.Bounds) bool { return b.Min <= n })
			node = el
			continue
		}
		child, st, err := node.Field(tok)
		if err != nil || st != argmap.FieldDeclared {
			return unknown()
		}
		always = always && requiredEverywhere(node, tok)
		node = child
	}
	return node, always, true
}

// requiredEverywhere reports whether every object alternative of node
// requires field.
func requiredEverywhere(node argmap.Node, field string) bool {
	reqs := node.Required()
	for _, r := range reqs {
		if !slices.Contains(r, field) {
			return false
		}
	}
	return len(reqs) > 0
}

// resourceRules: a resource read takes no arguments. At most one handle
// may choose the resource it reads (see the orchestrator's callTarget);
// nothing else can be sent, so a map that says otherwise would fail every
// call.
func (c *argCheck) resourceRules(bindings []*binding) {
	if len(c.req.GetDefaults().GetFields()) > 0 {
		c.add("defaults", "a resource read takes no arguments; remove the defaults")
	}
	handles := 0
	for _, b := range bindings {
		switch {
		case b.constant != nil:
			c.add(b.at+".constant", "a resource read takes no arguments; only a handle may choose the resource it reads")
		case b.checked && !b.handle:
			c.add(b.at+".product_field", "a resource read takes no arguments; only a handle may choose the resource it reads, and %s is a value", display(b.product))
		case b.handle:
			if handles++; handles == 2 {
				c.add(b.at, "a resource read reads one resource; bind at most one handle")
			}
		}
	}
}

// remoteSide simulates the remote arguments and checks them against the
// tool's input schema.
func (c *argCheck) remoteSide(bindings []*binding) {
	root, err := argmap.NewSchema(c.tool.GetInputSchema().AsMap()).Root()
	if err != nil {
		c.add("argument_map", "the input schema of tool %q cannot be checked, so nothing can be bound to it: %v", c.tool.GetName(), err)
		return
	}
	var checked []*binding
	for _, b := range bindings {
		if b.checked {
			checked = append(checked, b)
		}
	}
	// Every binding present: what a call carrying every product field
	// sends. Types, paths, constants and defaults are checked here.
	all := c.simulate(checked, func(*binding) bool { return true }, true)
	c.checkTree(root, all, nil)
	missingAll := c.missingRequired(root, all, nil)
	for _, q := range missingAll {
		c.add("argument_map", "missing required remote field %s of tool %q: bind a product field or a constant to it, or give it a default", display(q), c.tool.GetName())
	}
	// Only what every call carries: required fields bound only by optional
	// product fields, too few items, and gaps an absent element leaves.
	always := c.simulate(checked, func(b *binding) bool { return b.always }, false)
	for _, q := range c.missingRequired(root, always, nil) {
		if !slices.ContainsFunc(missingAll, func(p argmap.Path) bool { return slices.Equal(p, q) }) {
			c.add("argument_map", "required remote field %s of tool %q is bound only by optional product fields, which a call may leave out: bind a required product field, a constant or a default to it",
				display(q), c.tool.GetName())
		}
	}
	c.checkMinItems(root, always, nil)
	for _, b := range checked {
		if b.always || !slices.ContainsFunc(b.remote[1:], func(t string) bool { _, ok := argmap.Index(t); return ok }) {
			continue
		}
		only := b
		c.simulate(checked, func(o *binding) bool { return o.always || o == only }, false)
	}
}

// simulate builds the remote arguments from the defaults and the
// bindings include selects, in map order, with bound placeholders for
// values. Only the first simulation (record) reports conflicts and notes
// who put each place there; later ones report what fails only when
// optional bindings are absent.
func (c *argCheck) simulate(bindings []*binding, include func(*binding) bool, record bool) map[string]any {
	tree := c.req.GetDefaults().AsMap()
	if tree == nil {
		tree = map[string]any{}
	}
	if record {
		c.recordDefaults(tree, nil)
	}
	for _, b := range bindings {
		if !include(b) || b.refused {
			continue
		}
		if record && c.overlaps(tree, b) {
			b.refused = true
			continue
		}
		concrete, err := argmap.Set(tree, b.remote, bound{b: b})
		if err != nil {
			if record {
				b.refused = true
				c.add(b.at+".remote_field", "remote path %s: %v", display(b.remote), err)
			} else if !c.reported(b.at + ".remote_field") {
				c.add(b.at+".remote_field", "remote path %s: %v (when the optional product fields bound before it are absent)", display(b.remote), err)
			}
			continue
		}
		if record {
			for j := 1; j <= len(concrete); j++ {
				if k := concrete[:j].String(); c.who[k] == "" {
					c.who[k] = b.at + ".remote_field"
				}
			}
		}
	}
	if k := c.req.GetIdempotencyKeyField(); k != "" {
		if _, taken := tree[k]; taken {
			if record {
				c.add("idempotency_key_field", "remote field %q receives the intent id; it cannot also be mapped or defaulted", k)
			}
		} else {
			tree[k] = bound{idem: true}
			if record {
				c.who[argmap.Path{k}.String()] = "idempotency_key_field"
			}
		}
	}
	return tree
}

func (c *argCheck) reported(field string) bool {
	return slices.ContainsFunc(c.v, func(f apierror.FieldViolation) bool { return f.Field == field })
}

// recordDefaults notes which defaults field put each place there, e.g.
// "defaults.options.depth" or "defaults.paths[0]", and refuses secrets.
func (c *argCheck) recordDefaults(v any, p argmap.Path) {
	field := "defaults"
	for i, t := range p {
		if p.Element(i) {
			field += "[" + t + "]"
		} else {
			field += "." + t
		}
	}
	if len(p) > 0 {
		c.who[p.String()] = field
	}
	switch x := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			c.recordDefaults(x[k], append(slices.Clip(p), k))
		}
	case []any:
		for i, e := range x {
			c.recordDefaults(e, append(slices.Clip(p), strconv.Itoa(i)))
		}
	case string:
		if len(p) > 0 && redact.SecretSetting(p[len(p)-1], x) {
			c.add(field, "the default at %s looks like a secret; a mapping is shown to reviewers and recorded, so credentials come from the connection's credential reference, never from defaults", display(p))
		}
	}
}

// overlaps reports (and refuses) a binding whose path another binding
// already binds, or lies inside a value another binding binds whole. A
// binding over a default is the map's documented precedence, but when the
// binding is always present the default is never sent, which is refused
// as a dead default a reviewer would misread.
func (c *argCheck) overlaps(tree map[string]any, b *binding) bool {
	for j := 1; j < len(b.remote); j++ {
		if v, ok := argmap.Get(tree, b.remote[:j]); ok {
			if o, isBound := v.(bound); isBound {
				c.add(b.at+".remote_field", "remote path %s lies inside %s, which %s binds whole", display(b.remote), display(b.remote[:j]), o.b.at)
				return true
			}
		}
	}
	if b.remote[len(b.remote)-1] == argmap.Append {
		return false
	}
	v, ok := argmap.Get(tree, b.remote)
	if !ok {
		return false
	}
	if o, isBound := v.(bound); isBound {
		c.add(b.at+".remote_field", "remote path %s is bound twice (also by %s)", display(b.remote), o.b.at)
		return true
	}
	if inner := firstBound(v); inner != nil {
		c.add(b.at+".remote_field", "remote path %s would replace what %s binds inside it", display(b.remote), inner.at)
		return true
	}
	if b.always {
		field := c.who[b.remote.String()]
		c.add(field, "the default at %s is never sent: %s binds it in every call", display(b.remote), b.at)
	}
	return false
}

func firstBound(v any) *binding {
	switch x := v.(type) {
	case bound:
		return x.b
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if b := firstBound(x[k]); b != nil {
				return b
			}
		}
	case []any:
		for _, e := range x {
			if b := firstBound(e); b != nil {
				return b
			}
		}
	}
	return nil
}

// field is the proposal field responsible for place p.
func (c *argCheck) field(p argmap.Path) string {
	if f := c.who[p.String()]; f != "" {
		return f
	}
	return "argument_map"
}

// checkTree walks the simulated arguments alongside the remote schema.
func (c *argCheck) checkTree(node argmap.Node, v any, p argmap.Path) {
	switch x := v.(type) {
	case bound:
		c.fit(node, x, p)
	case map[string]any:
		if !node.Types().Has(argmap.TypeObject) {
			if len(p) == 0 {
				c.add("argument_map", "the input schema of tool %q does not describe an object, so no argument can be bound", c.tool.GetName())
			} else {
				c.add(c.field(p), "remote %s is %s, not an object, so nothing can be set inside it", display(p), node.Types())
			}
			return
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			q := append(slices.Clip(p), k)
			child, st, err := node.Field(k)
			switch {
			case err != nil:
				c.add(c.field(q), "remote schema at %s cannot be checked: %v", display(q), err)
			case st != argmap.FieldDeclared:
				where := ""
				if len(p) > 0 {
					where = " at " + display(p)
				}
				c.add(c.field(q), "remote field %s is not in the input schema of tool %q (fields%s: %s)", display(q), c.tool.GetName(), where, names(node.FieldNames()))
			default:
				c.checkTree(child, x[k], q)
			}
		}
	case []any:
		if !node.Types().Has(argmap.TypeArray) {
			c.add(c.field(p), "remote %s is %s, not an array, so it has no elements to set", display(p), node.Types())
			return
		}
		for i, e := range x {
			q := append(slices.Clip(p), strconv.Itoa(i))
			el, _, err := node.Element(i)
			if err != nil {
				c.add(c.field(q), "remote schema at %s cannot be checked: %v", display(q), err)
				continue
			}
			c.checkTree(el, e, q)
		}
		if bounds := node.ItemBounds(); len(bounds) > 0 && !slices.ContainsFunc(bounds, func(b argmap.Bounds) bool { return b.Max < 0 || b.Max >= len(x) }) {
			c.add(c.field(p), "remote %s accepts at most %d items; the map can send %d", display(p), maxOf(bounds), len(x))
		}
	default:
		if err := node.Validate(x); err != nil {
			c.add(c.field(p), "the default at %s does not fit the remote schema: %v", display(p), err)
		}
	}
}

func maxOf(bounds []argmap.Bounds) int {
	m := 0
	for _, b := range bounds {
		m = max(m, b.Max)
	}
	return m
}

// fit checks one bound value against the remote schema at its place.
func (c *argCheck) fit(node argmap.Node, x bound, p argmap.Path) {
	if x.idem {
		if !node.Types().Has(argmap.TypeString) || node.Closed(argmap.TypeString) {
			c.add("idempotency_key_field", "remote field %q is %s; it receives the intent id, a string", p[0], node.Types())
		}
		return
	}
	b := x.b
	if node.Impossible() {
		c.add(b.at+".remote_field", "the remote schema forbids any value at %s", display(p))
		return
	}
	if b.constant != nil {
		c.checkConstant(node, b.constant.AsInterface(), p, b.at+".constant")
		return
	}
	what := fmt.Sprintf("product field %s (%s)", display(b.product), b.src)
	if b.handle {
		what = fmt.Sprintf("product field %s (a handle, sent as its resolved target: a string)", display(b.product))
	}
	remote := node.Types()
	if !remote.Has(b.src) {
		hint := ""
		if remote.Has(argmap.TypeArray) {
			if el, _, err := node.Element(0); err == nil && el.Types().Has(b.src) {
				hint = fmt.Sprintf("; bind it to %s/- to send a one-element array", b.remote.String())
			}
		}
		if b.src.Has(argmap.TypeNumber) && remote.Has(argmap.TypeInteger) {
			hint = "; a number may have a fraction, an integer may not"
		}
		c.add(b.at+".remote_field", "%s cannot fit remote %s (%s)%s", what, display(p), remote, hint)
		return
	}
	if !b.handle {
		if why := fitComposite(b.srcNode, node, 0); why != "" {
			c.add(b.at+".remote_field", "%s cannot fit remote %s: %s", what, display(p), why)
			return
		}
	}
	if node.Closed(b.src) {
		values, listed := b.srcNode.Values()
		if b.handle || !listed {
			c.add(b.at+".remote_field", "remote %s accepts only listed values (enum or const), but %s may carry any value: bind a constant, or list the values in the capability's input schema", display(p), what)
			return
		}
		for _, val := range values {
			if err := node.Validate(val); err != nil {
				c.add(b.at+".remote_field", "%s may carry %v, which remote %s refuses: %v", what, val, display(p), err)
				return
			}
		}
	}
}

// fitComposite compares the items and fields of a product array or
// object with the remote's, or returns "".
func fitComposite(prod, remote argmap.Node, depth int) string {
	if depth > maxCompositeDepth {
		return "nested too deeply to compare"
	}
	t := prod.Types()
	if t&argmap.TypeArray != 0 {
		pe, _, perr := prod.Element(0)
		re, _, rerr := remote.Element(0)
		if perr != nil || rerr != nil {
			return "array items cannot be compared"
		}
		if !re.Types().Has(pe.Types()) {
			return fmt.Sprintf("items are %s, the remote takes %s", pe.Types(), re.Types())
		}
		if why := fitComposite(pe, re, depth+1); why != "" {
			return "items: " + why
		}
	}
	if t&argmap.TypeObject != 0 {
		for _, name := range prod.FieldNames() {
			pc, _, perr := prod.Field(name)
			rc, st, rerr := remote.Field(name)
			if perr != nil || rerr != nil || st != argmap.FieldDeclared {
				return fmt.Sprintf("field %q is not declared by the remote", name)
			}
			if !rc.Types().Has(pc.Types()) {
				return fmt.Sprintf("field %q is %s, the remote takes %s", name, pc.Types(), rc.Types())
			}
			if why := fitComposite(pc, rc, depth+1); why != "" {
				return fmt.Sprintf("field %q: %s", name, why)
			}
		}
		if reqs := remote.Required(); len(reqs) > 0 {
			for _, r := range reqs[0] {
				if !requiredEverywhere(prod, r) {
					return fmt.Sprintf("the remote requires field %q, which the product does not", r)
				}
			}
		}
	}
	return ""
}

// checkConstant checks a constant against the remote schema at p: every
// object field it carries must be declared (as for bound paths), the
// whole value must validate, and nothing in it may look like a secret.
func (c *argCheck) checkConstant(node argmap.Node, v any, p argmap.Path, field string) {
	if !c.constantFields(node, v, p, field) {
		return
	}
	if err := node.Validate(v); err != nil {
		c.add(field, "the constant %s cannot fit remote %s (%s): %v", argmap.Describe(v), display(p), node.Types(), err)
	}
}

func (c *argCheck) constantFields(node argmap.Node, v any, p argmap.Path, field string) bool {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			q := append(slices.Clip(p), k)
			child, st, err := node.Field(k)
			if err != nil || st != argmap.FieldDeclared {
				c.add(field, "the constant sets remote field %s, which the input schema of tool %q does not declare", display(q), c.tool.GetName())
				return false
			}
			if !c.constantFields(child, x[k], q, field) {
				return false
			}
		}
	case []any:
		for i, e := range x {
			el, _, err := node.Element(i)
			if err != nil {
				return true // Validate reports it
			}
			if !c.constantFields(el, e, append(slices.Clip(p), strconv.Itoa(i)), field) {
				return false
			}
		}
	case string:
		name := ""
		for i := len(p) - 1; i >= 0; i-- {
			if !p.Element(i) {
				name = p[i]
				break
			}
		}
		if redact.SecretSetting(name, x) {
			c.add(field, "the constant at %s looks like a secret; a mapping is shown to reviewers and recorded, so credentials come from the connection's credential reference, never from a mapping", display(p))
			return false
		}
	}
	return true
}

// missingRequired returns the required fields no value sits at, for every
// object in the simulated arguments (the arguments themselves included).
// Of an object's alternatives, the one missing least is reported.
func (c *argCheck) missingRequired(node argmap.Node, v any, p argmap.Path) []argmap.Path {
	var out []argmap.Path
	switch x := v.(type) {
	case map[string]any:
		var best []string
		for i, req := range node.Required() {
			var miss []string
			for _, r := range req {
				if _, ok := x[r]; !ok {
					miss = append(miss, r)
				}
			}
			if i == 0 || len(miss) < len(best) {
				best = miss
			}
		}
		for _, r := range best {
			out = append(out, append(slices.Clip(p), r))
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if child, st, err := node.Field(k); err == nil && st == argmap.FieldDeclared {
				out = append(out, c.missingRequired(child, x[k], append(slices.Clip(p), k))...)
			}
		}
	case []any:
		for i, e := range x {
			if el, _, err := node.Element(i); err == nil {
				out = append(out, c.missingRequired(el, e, append(slices.Clip(p), strconv.Itoa(i)))...)
			}
		}
	}
	return out
}

// checkMinItems refuses arrays that every call sends with fewer items than
// the remote requires.
func (c *argCheck) checkMinItems(node argmap.Node, v any, p argmap.Path) {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if child, st, err := node.Field(k); err == nil && st == argmap.FieldDeclared {
				c.checkMinItems(child, x[k], append(slices.Clip(p), k))
			}
		}
	case []any:
		bounds := node.ItemBounds()
		if len(bounds) > 0 && !slices.ContainsFunc(bounds, func(b argmap.Bounds) bool { return b.Min <= len(x) }) {
			least := bounds[0].Min
			for _, b := range bounds {
				least = min(least, b.Min)
			}
			c.add(c.field(p), "remote %s needs at least %d items; every call sends %d (optional product fields may be absent)", display(p), least, len(x))
		}
		for i, e := range x {
			if el, _, err := node.Element(i); err == nil {
				c.checkMinItems(el, e, append(slices.Clip(p), strconv.Itoa(i)))
			}
		}
	}
}

// display shows a path as its author would: a top-level name quoted as
// before paths existed, anything deeper as a JSON Pointer.
func display(p argmap.Path) string {
	if len(p) == 1 {
		return strconv.Quote(p[0])
	}
	return p.String()
}

func names(fields []string) string {
	if len(fields) == 0 {
		return "none"
	}
	return strings.Join(fields, ", ")
}
