// Package indexes implements the compressed list of completion indexes used
// by the Job API in status.completedIndexes, status.failedIndexes and the
// succeededIndexes of a successPolicy rule: decimal indexes and closed ranges
// "first-last", separated by commas and in increasing order, e.g. "1,3-5,7".
//
// A Set is an ordered list of disjoint, non-adjacent closed intervals, so a
// Set has exactly one canonical text form, produced by String.
package indexes

import (
	"fmt"
	"iter"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// MaxIndex is the largest completion index. Indexes are below
// spec.completions, an int32, so every index fits in an int32 and the
// number of indexes in a Set fits in an int on every platform.
const MaxIndex = math.MaxInt32 - 1

// Interval is the closed range of indexes [First, Last], First <= Last.
type Interval struct {
	First, Last int
}

// Set is a set of completion indexes, held as ordered intervals.
//
// The zero value is the empty set. A Set holds a slice: copies of a Set
// share storage, so Clone a Set before calling Add on a copy whose original
// is still in use. Methods other than Add never modify the receiver.
type Set struct {
	ivs []Interval
}

// Of returns the set of the given indexes, in any order and with
// duplicates. Indexes outside [0, MaxIndex] are skipped, as in Add.
func Of(ixs ...int) Set {
	sorted := slices.Clone(ixs)
	slices.Sort(sorted)
	var s Set
	for _, ix := range sorted {
		if ix < 0 || ix > MaxIndex {
			continue
		}
		if n := len(s.ivs); n > 0 && ix <= s.ivs[n-1].Last+1 {
			s.ivs[n-1].Last = max(s.ivs[n-1].Last, ix)
			continue
		}
		s.ivs = append(s.ivs, Interval{ix, ix})
	}
	return s
}

// Clone returns a copy of s that shares no storage with s.
func (s Set) Clone() Set {
	return Set{ivs: slices.Clone(s.ivs)}
}

// String returns the canonical text form, as the built-in Job controller
// writes it: a run of three or more consecutive indexes is written "a-b", a
// run of exactly two is written "a,b", and the empty set is "".
func (s Set) String() string {
	var b strings.Builder
	for _, iv := range s.ivs {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(iv.First))
		switch {
		case iv.Last == iv.First+1:
			b.WriteByte(',')
			b.WriteString(strconv.Itoa(iv.Last))
		case iv.Last > iv.First+1:
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(iv.Last))
		}
	}
	return b.String()
}

// Has reports whether ix is in s. It takes O(log Len()).
func (s Set) Has(ix int) bool {
	k := s.search(ix)
	return k < len(s.ivs) && s.ivs[k].First <= ix
}

// search returns the position of the first interval that ends at or after ix,
// or Len() when there is none.
func (s Set) search(ix int) int {
	return sort.Search(len(s.ivs), func(k int) bool { return s.ivs[k].Last >= ix })
}

// Add inserts ix into s in place, merging it with the intervals on either
// side when they become adjacent, and reports whether s changed. An index
// outside [0, MaxIndex] is not a completion index: Add ignores it and
// returns false. Add takes O(log Len()) to find the place plus, when a new
// interval is opened or two are joined, a copy of the intervals after it.
func (s *Set) Add(ix int) bool {
	if ix < 0 || ix > MaxIndex {
		return false
	}
	k := s.search(ix)
	if k < len(s.ivs) && s.ivs[k].First <= ix {
		return false
	}
	joinsLeft := k > 0 && s.ivs[k-1].Last == ix-1
	joinsRight := k < len(s.ivs) && s.ivs[k].First == ix+1
	switch {
	case joinsLeft && joinsRight:
		s.ivs[k-1].Last = s.ivs[k].Last
		s.ivs = slices.Delete(s.ivs, k, k+1)
	case joinsLeft:
		s.ivs[k-1].Last = ix
	case joinsRight:
		s.ivs[k].First = ix
	default:
		s.ivs = slices.Insert(s.ivs, k, Interval{ix, ix})
	}
	return true
}

// Union returns a new set with the indexes of s and o. It takes
// O(s.Len() + o.Len()).
func (s Set) Union(o Set) Set {
	out := make([]Interval, 0, len(s.ivs)+len(o.ivs))
	appendMerged := func(iv Interval) {
		if n := len(out); n > 0 && iv.First <= out[n-1].Last+1 {
			out[n-1].Last = max(out[n-1].Last, iv.Last)
			return
		}
		out = append(out, iv)
	}
	i, j := 0, 0
	for i < len(s.ivs) || j < len(o.ivs) {
		if j == len(o.ivs) || (i < len(s.ivs) && s.ivs[i].First <= o.ivs[j].First) {
			appendMerged(s.ivs[i])
			i++
		} else {
			appendMerged(o.ivs[j])
			j++
		}
	}
	return Set{ivs: out}
}

// Equal reports whether s and o hold the same indexes.
func (s Set) Equal(o Set) bool {
	return slices.Equal(s.ivs, o.ivs)
}

// Count returns the number of indexes in s.
func (s Set) Count() int {
	n := 0
	for _, iv := range s.ivs {
		n += iv.Last - iv.First + 1
	}
	return n
}

// Len returns the number of intervals in s, which bounds the cost of the
// operations on s.
func (s Set) Len() int {
	return len(s.ivs)
}

// All yields the indexes of s in increasing order.
func (s Set) All() iter.Seq[int] {
	return func(yield func(int) bool) {
		for _, iv := range s.ivs {
			for ix := iv.First; ix <= iv.Last; ix++ {
				if !yield(ix) {
					return
				}
			}
		}
	}
}

// Intervals yields the intervals of s in increasing order; none of them
// overlap or touch.
func (s Set) Intervals() iter.Seq[Interval] {
	return func(yield func(Interval) bool) {
		for _, iv := range s.ivs {
			if !yield(iv) {
				return
			}
		}
	}
}

// ParseError describes where and why a text is not a valid index list.
type ParseError struct {
	// Offset is the byte offset in the input at which the problem was found.
	Offset int
	// Fragment is the comma-separated part of the input that holds the
	// problem, shortened when long.
	Fragment string
	// Reason says what is wrong.
	Reason string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("invalid index list: interval %q at offset %d: %s", e.Fragment, e.Offset, e.Reason)
}

// Parse parses an index list such as "1,3-5,7"; the empty string is the
// empty set. It accepts what the API server accepts for a managed Job's
// status, minus the signs it tolerates: each comma-separated part is an index
// or a range "first-last" with first < last; indexes are unsigned decimal
// numbers (digits only: no sign, space or other character) up to MaxIndex;
// each part starts after the previous one ends. Adjacent parts such as
// "1-3,4" and two-index ranges such as "1-2" are valid and are merged, so
// String may differ from the input.
func Parse(s string) (Set, error) {
	return parse(s, MaxIndex, fmt.Sprintf("greater than %d", MaxIndex))
}

// ParseWithin is Parse that also rejects indexes that are not below
// completions, as the API server does for completedIndexes and failedIndexes.
func ParseWithin(s string, completions int32) (Set, error) {
	return parse(s, int(completions)-1, fmt.Sprintf("not below completions (%d)", completions))
}

// parse parses s, rejecting indexes above limit with the reason tooBig.
func parse(s string, limit int, tooBig string) (Set, error) {
	var out Set
	if s == "" {
		return out, nil
	}
	for off := 0; off <= len(s); {
		part, _, _ := strings.Cut(s[off:], ",")
		iv, err := parseInterval(part, off, limit, tooBig)
		if err != nil {
			return Set{}, err
		}
		n := len(out.ivs)
		switch {
		case n > 0 && iv.First <= out.ivs[n-1].Last:
			return Set{}, &ParseError{Offset: off, Fragment: shorten(part),
				Reason: fmt.Sprintf("starts at %d, not after the end of the previous interval (%d): intervals must be in increasing order and must not overlap", iv.First, out.ivs[n-1].Last)}
		case n > 0 && iv.First == out.ivs[n-1].Last+1:
			out.ivs[n-1].Last = iv.Last
		default:
			out.ivs = append(out.ivs, iv)
		}
		off += len(part) + 1
	}
	return out, nil
}

func parseInterval(part string, off, limit int, tooBig string) (Interval, error) {
	fail := func(at int, format string, args ...any) (Interval, error) {
		return Interval{}, &ParseError{Offset: at, Fragment: shorten(part), Reason: fmt.Sprintf(format, args...)}
	}
	if part == "" {
		return fail(off, "empty interval")
	}
	firstStr, lastStr, isRange := strings.Cut(part, "-")
	if firstStr == "" {
		if isRange {
			return fail(off, "missing index before '-' (indexes cannot be negative)")
		}
		return fail(off, "missing index")
	}
	first, err := parseIndex(firstStr, off, part, limit, tooBig)
	if err != nil {
		return Interval{}, err
	}
	if !isRange {
		return Interval{first, first}, nil
	}
	lastOff := off + len(firstStr) + 1
	if lastStr == "" {
		return fail(lastOff, "missing last index after '-'")
	}
	if i := strings.IndexByte(lastStr, '-'); i >= 0 {
		return fail(lastOff+i, "more than one '-' in an interval")
	}
	last, err := parseIndex(lastStr, lastOff, part, limit, tooBig)
	if err != nil {
		return Interval{}, err
	}
	switch {
	case first > last:
		return fail(lastOff, "first index %d is greater than last index %d", first, last)
	case first == last:
		return fail(lastOff, "range with equal ends (the API server rejects it); write the single index %d", first)
	}
	return Interval{first, last}, nil
}

// parseIndex parses the unsigned decimal index str, which starts at offset
// off of the input and belongs to part.
func parseIndex(str string, off int, part string, limit int, tooBig string) (int, error) {
	fail := func(at int, format string, args ...any) (int, error) {
		return 0, &ParseError{Offset: at, Fragment: shorten(part), Reason: fmt.Sprintf(format, args...)}
	}
	var n int64 // int64: the running value may pass MaxIndex before it is rejected
	for i := 0; i < len(str); i++ {
		c := str[i]
		if c < '0' || c > '9' {
			return fail(off+i, "unexpected character %q: an index is an unsigned decimal number", c)
		}
		if n <= MaxIndex {
			n = n*10 + int64(c-'0')
		}
	}
	if n > MaxIndex {
		return fail(off, "index %s is greater than the largest completion index (%d)", shorten(str), MaxIndex)
	}
	if int(n) > limit {
		return fail(off, "index %d is %s", n, tooBig)
	}
	return int(n), nil
}

// shorten keeps error messages small when the input is a huge status field.
func shorten(s string) string {
	const maxLen = 40
	if len(s) <= maxLen {
		return s
	}
	return s[:maxLen] + "..."
}
