package adapter

import (
	"bytes"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// The credential matcher. A server can echo a credential changed in ways
// that keep it readable: in another case, percent-encoded (either hex
// case), base64 (either alphabet, any padding, wrapped), base32, hex, with
// whitespace or invisible characters inserted, or cut into pieces spread
// over several strings. Text is therefore matched on a normalized view of
// it, one linear pass per string, against forms of each credential
// computed once when it is resolved:
//
//   - The view percent-decodes, decodes JSON escapes (when scanning
//     encoded JSON), folds ASCII case, maps the URL base64 alphabet onto
//     the standard one ('-' to '+', '_' to '/'), and drops whitespace,
//     control and format (zero-width, bidi) characters, backslashes and '='
//     (base64 and base32 padding). Each credential form is normalized the
//     same way, so a form present in the text is present in its view.
//   - Any run of at least minFragment characters of a form (minHexFragment
//     for hex) is a match, not only the whole form: a credential cut into
//     two halves, a prefix left by truncation, or a piece in each of a
//     result's items is caught in each string on its own.
//   - A match maps back to the original text, where it is replaced; a
//     match of an encoded form also takes the rest of its run of encoding
//     characters (the partial characters at its ends and the padding).

const (
	// minFragment is the shortest run of a credential form (normalized
	// characters) that is scrubbed: shorter runs match unrelated text too
	// often. The raw value is always scrubbed whole, however short.
	minFragment = 8
	// minHexFragment is minFragment for the hex form, whose characters
	// carry half a byte each: 8 bytes of the credential, as for the raw
	// form.
	minHexFragment = 16
	// anchorLen is the length of the windows looked up in the text, and
	// anchorStride the distance between the positions looked up: any run
	// of anchorLen+anchorStride-1 = minFragment characters holds a window
	// at such a position, and the text is looked up at a quarter of its
	// positions.
	anchorLen    = 5
	anchorStride = 4
	// maxRefsPerAnchor bounds the work at one position for a credential
	// whose forms repeat themselves ("aaaaaaaa..."), where one window
	// occurs at many offsets.
	maxRefsPerAnchor = 16
	// filterBits is log2 of the size of the bit filter that rules out most
	// positions before a map lookup.
	filterBits = 16
)

// asciiNorm is the normalized view of each ASCII character; 0 drops it.
var asciiNorm = func() (t [utf8.RuneSelf]byte) {
	for b := range utf8.RuneSelf {
		c := byte(b)
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c == '-':
			c = '+'
		case c == '_':
			c = '/'
		case c <= ' ' || c == 0x7f || c == '=' || c == '\\':
			c = 0
		}
		t[b] = c
	}
	return t
}()

// Encoding alphabets, for extending a match of an encoded form over the
// rest of its run in the original text.
var (
	base64Chars = charSet("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_=")
	base32Chars = charSet("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz234567=")
	hexChars    = charSet("0123456789abcdefABCDEF")
)

func charSet(s string) *[256]bool {
	var t [256]bool
	for i := range len(s) {
		t[s[i]] = true
	}
	return &t
}

// form is one normalized form of a credential.
type form struct {
	norm   []byte
	minRun int        // shortest run of it that matches
	chars  *[256]bool // the encoding's alphabet; nil for the raw form
}

// anchorRef is where a window occurs in a form.
type anchorRef struct{ form, off int32 }

// matcher finds credential forms in text. It is immutable once built.
type matcher struct {
	forms []form
	// anchors are the windows (anchorLen bytes) of every form, at every
	// offset; filter has a bit set for each.
	anchors map[uint64][]anchorRef
	filter  [1 << filterBits / 64]uint64
	// shorts are forms shorter than minFragment: matched whole.
	shorts []int
}

// newMatcher compiles the forms of every credential value.
func newMatcher(values []string) *matcher {
	m := &matcher{anchors: map[uint64][]anchorRef{}}
	var seen [][]byte
	// addForm adds s's normalized form; minRun 0 means the whole form,
	// up to minFragment.
	addForm := func(s string, minRun int, chars *[256]bool) {
		var v normView
		v.normalize(s, false, false)
		n := v.b
		if minRun == 0 {
			minRun = min(minFragment, len(n))
		}
		if len(n) == 0 || len(n) < minRun || slices.ContainsFunc(seen, func(b []byte) bool { return bytes.Equal(b, n) }) {
			return
		}
		seen = append(seen, n)
		m.forms = append(m.forms, form{norm: n, minRun: minRun, chars: chars})
		fi := int32(len(m.forms) - 1)
		if len(n) < minFragment {
			m.shorts = append(m.shorts, int(fi))
			return
		}
		for off := 0; off+anchorLen <= len(n); off++ {
			x := window(n, off)
			if refs := m.anchors[x]; len(refs) < maxRefsPerAnchor {
				m.anchors[x] = append(refs, anchorRef{fi, int32(off)})
			}
			h := filterHash(x)
			m.filter[h/64] |= 1 << (h % 64)
		}
	}
	for _, v := range values {
		// The raw value is scrubbed whole however short, and by any run
		// of minFragment characters.
		addForm(v, 0, nil)
		for align := range 3 {
			addForm(encodedCore(base64.StdEncoding.EncodeToString, 6, v, align), minFragment, base64Chars)
		}
		for align := range 5 {
			addForm(encodedCore(base32.StdEncoding.EncodeToString, 5, v, align), minFragment, base32Chars)
		}
		addForm(hex.EncodeToString([]byte(v)), minHexFragment, hexChars)
	}
	return m
}

func filterHash(x uint64) uint64 { return (x * 0x9E3779B97F4A7C15) >> (64 - filterBits) }

// encodedCore is the part of the encoding of v, when v starts align bytes
// into a longer text, that depends on v's bytes alone (bits bits per
// character): it appears in the encoding of any text with v at such an
// offset, as in "Basic base64(user:secret)".
func encodedCore(enc func([]byte) string, bits int, v string, align int) string {
	s := enc(append(make([]byte, align), v...))
	first := (8*align + bits - 1) / bits // first character whose bits are all v's
	last := (8 * (align + len(v))) / bits
	if first >= last || last > len(s) {
		return ""
	}
	return s[first:last]
}

// span is a match: [start, end) in a normalized view, or in the original
// text, of form.
type span struct {
	start, end int
	form       int32
}

// window is the anchor window of n at p.
func window(n []byte, p int) uint64 {
	return uint64(binary.LittleEndian.Uint32(n[p:])) | uint64(n[p+4])<<32
}

// find returns the matches in a normalized view, in order: every run of
// a form of at least its minRun characters, extended both ways as far as
// it goes.
func (m *matcher) find(n []byte, spans []span) []span {
	for p := 0; p+anchorLen <= len(n); p += anchorStride {
		x := window(n, p)
		if h := filterHash(x); m.filter[h/64]&(1<<(h%64)) == 0 {
			continue
		}
		best := span{form: -1}
		for _, ref := range m.anchors[x] {
			f := &m.forms[ref.form]
			back := commonSuffix(n[:p], f.norm[:ref.off])
			fwd := commonPrefix(n[p:], f.norm[ref.off:])
			if r := back + fwd; r >= f.minRun && r > best.end-best.start {
				best = span{p - back, p + fwd, ref.form}
			}
		}
		if best.form < 0 {
			continue
		}
		spans = append(spans, best)
		// The run is whole: the next position looked up is past it.
		for p+anchorStride < best.end {
			p += anchorStride
		}
	}
	for _, fi := range m.shorts {
		f := m.forms[fi].norm
		for off := 0; ; {
			i := bytes.Index(n[off:], f)
			if i < 0 {
				break
			}
			spans = append(spans, span{off + i, off + i + len(f), int32(fi)})
			off += i + len(f)
		}
	}
	return spans
}

func commonSuffix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 1; i <= n; i++ {
		if a[len(a)-i] != b[len(b)-i] {
			return i - 1
		}
	}
	return n
}

func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// normView is the normalized view of a text, and when mapped, the span
// of the original text each of its bytes came from.
type normView struct {
	b          []byte
	start, end []int32
}

var viewPool = sync.Pool{New: func() any { return new(normView) }}

// maxPooledView is the largest view kept for reuse.
const maxPooledView = 1 << 20

func releaseView(v *normView) {
	if cap(v.b) <= maxPooledView {
		v.b, v.start, v.end = v.b[:0], v.start[:0], v.end[:0]
		viewPool.Put(v)
	}
}

// Classes of a byte in the normalized view's fast path, beside the
// byte it becomes.
const (
	byteSpecial = 0 // decoded by decodeUnit: '%', non-ASCII, '\\' in JSON
	byteDropped = 1
)

// byteClass is, for text (0) and for encoded JSON (1), what each byte
// becomes: its normalized view, or a class.
var byteClass = func() (t [2][256]byte) {
	for mode := range 2 {
		for c := range 256 {
			switch {
			case c >= utf8.RuneSelf || c == '%' || (c == '\\' && mode == 1):
				t[mode][c] = byteSpecial
			case asciiNorm[c] == 0:
				t[mode][c] = byteDropped
			default:
				t[mode][c] = asciiNorm[c]
			}
		}
	}
	return t
}()

// normalize sets v to the normalized view of s: text, or encoded JSON
// when jsonMode (its escapes are decoded). The view is never longer than
// s: every decoding shortens its input or keeps its length.
func (v *normView) normalize(s string, jsonMode, mapped bool) {
	if cap(v.b) < len(s) {
		v.b = make([]byte, len(s))
	}
	b := v.b[:len(s)]
	var start, end []int32
	if mapped {
		if cap(v.start) < len(s) {
			v.start, v.end = make([]int32, len(s)), make([]int32, len(s))
		}
		start, end = v.start[:len(s)], v.end[:len(s)]
	}
	class := &byteClass[0]
	if jsonMode {
		class = &byteClass[1]
	}
	n := 0
	for i := 0; i < len(s); {
		if !mapped {
			// Most text is plain ASCII: a branch-free loop until a byte
			// that needs decoding.
			for ; i < len(s); i++ {
				c := class[s[i]]
				if c == byteSpecial {
					break
				}
				b[n] = c
				n += (int(c) + 0xFE) >> 8 // 0 for byteDropped, else 1
			}
			if i == len(s) {
				break
			}
		}
		c := class[s[i]]
		if c > byteDropped {
			b[n] = c
			if mapped {
				start[n], end[n] = int32(i), int32(i+1)
			}
			n++
			i++
			continue
		}
		if c == byteDropped {
			i++
			continue
		}
		r, next := decodeUnit(s, i, jsonMode)
		w := emit(b[n:], r)
		if mapped {
			for k := n; k < n+w; k++ {
				start[k], end[k] = int32(i), int32(next)
			}
		}
		n += w
		i = next
	}
	v.b = b[:n]
	if mapped {
		v.start, v.end = start[:n], end[:n]
	}
}

// emit writes the normalized view of r into b and returns its length.
func emit(b []byte, r rune) int {
	switch {
	case r < utf8.RuneSelf:
		if o := asciiNorm[r]; o != 0 {
			b[0] = o
			return 1
		}
		return 0
	case r == utf8.RuneError, unicode.IsSpace(r), unicode.Is(unicode.Cf, r):
		// Dropped: bytes that are not UTF-8, whitespace, and invisible
		// format characters (zero-width spaces and joiners, bidi marks,
		// the byte order mark, soft hyphen).
		return 0
	}
	return utf8.EncodeRune(b, r)
}

// decodeUnit decodes the character at s[i]: a percent-encoded one (a
// UTF-8 sequence of several triplets whole), a JSON escape in jsonMode,
// or a UTF-8 sequence. It returns the character and where the next
// starts.
func decodeUnit(s string, i int, jsonMode bool) (rune, int) {
	switch c := s[i]; {
	case c == '%':
		b, ok := unhex2(s, i+1)
		if !ok {
			return '%', i + 1
		}
		if b < utf8.RuneSelf {
			return rune(b), i + 3
		}
		var buf [utf8.UTFMax]byte
		buf[0] = b
		n, j := 1, i+3
		for n < utf8.UTFMax && j < len(s) && s[j] == '%' {
			cb, ok := unhex2(s, j+1)
			if !ok || utf8.RuneStart(cb) {
				break
			}
			buf[n] = cb
			n, j = n+1, j+3
		}
		r, size := utf8.DecodeRune(buf[:n])
		if r == utf8.RuneError && size <= 1 {
			return utf8.RuneError, i + 3
		}
		return r, i + 3*size
	case c == '\\' && jsonMode:
		if i+1 >= len(s) {
			return '\\', i + 1
		}
		switch s[i+1] {
		case 'n', 'r', 't', 'b', 'f':
			return ' ', i + 2
		case 'u':
			r, ok := unhex4(s, i+2)
			if !ok {
				return '\\', i + 1
			}
			if utf16IsHigh(r) && i+12 <= len(s) && s[i+6] == '\\' && s[i+7] == 'u' {
				if lo, ok := unhex4(s, i+8); ok && utf16IsLow(lo) {
					return (r-0xD800)<<10 + (lo - 0xDC00) + 0x10000, i + 12
				}
			}
			return r, i + 6
		default:
			return rune(s[i+1]), i + 2
		}
	default:
		r, size := utf8.DecodeRuneInString(s[i:])
		return r, i + size
	}
}

func utf16IsHigh(r rune) bool { return r >= 0xD800 && r < 0xDC00 }
func utf16IsLow(r rune) bool  { return r >= 0xDC00 && r < 0xE000 }

func unhex2(s string, i int) (byte, bool) {
	if i+2 > len(s) {
		return 0, false
	}
	h, ok1 := hexVal(s[i])
	l, ok2 := hexVal(s[i+1])
	return h<<4 | l, ok1 && ok2
}

func unhex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for k := range 4 {
		d, ok := hexVal(s[i+k])
		if !ok {
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// contains reports whether s (encoded JSON when jsonMode) holds a
// credential form.
func (m *matcher) contains(s string, jsonMode bool) bool {
	v := viewPool.Get().(*normView)
	defer releaseView(v)
	v.normalize(s, jsonMode, false)
	var buf [4]span
	return len(m.find(v.b, buf[:0])) > 0
}

// scrub returns s with every credential form replaced by
// RedactedCredential.
func (m *matcher) scrub(s string) string {
	v := viewPool.Get().(*normView)
	defer releaseView(v)
	// Most text holds no credential: the view is built without its map
	// first, and mapped only when something matched.
	v.normalize(s, false, false)
	var buf [4]span
	if len(m.find(v.b, buf[:0])) == 0 {
		return s
	}
	v.normalize(s, false, true)
	found := m.find(v.b, buf[:0])
	spans := make([]span, 0, len(found))
	for _, f := range found {
		sp := span{start: int(v.start[f.start]), end: int(v.end[f.end-1]), form: f.form}
		if chars := m.forms[f.form].chars; chars != nil {
			for sp.start > 0 && chars[s[sp.start-1]] {
				sp.start--
			}
			for sp.end < len(s) && chars[s[sp.end]] {
				sp.end++
			}
		}
		spans = append(spans, sp)
	}
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	// Disjoint, so that each run of credential becomes one marker.
	merged := spans[:1]
	for _, sp := range spans[1:] {
		if last := &merged[len(merged)-1]; sp.start <= last.end {
			last.end = max(last.end, sp.end)
			continue
		}
		merged = append(merged, sp)
	}
	var out strings.Builder
	out.Grow(len(s))
	at := 0
	for _, sp := range merged {
		out.WriteString(s[at:sp.start])
		out.WriteString(RedactedCredential)
		at = sp.end
	}
	out.WriteString(s[at:])
	return out.String()
}
