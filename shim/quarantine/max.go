package quarantine

import (
	"fmt"
	"strconv"
	"strings"
)

// Max is --quarantine-max: a number of nodes, or a percentage of the nodes that exist.
// The zero value allows one node.
type Max struct {
	// N is the number of nodes, when Percent is false; else the percentage.
	N       int
	Percent bool
}

// ParseMax reads "N" (N >= 1) or "P%" (0 < P <= 100).
func ParseMax(s string) (Max, error) {
	v := strings.TrimSpace(s)
	p, percent := strings.CutSuffix(v, "%")
	n, err := strconv.Atoi(p)
	switch {
	case err != nil:
		return Max{}, fmt.Errorf("%q: want a number of nodes (3) or a percentage of the nodes (10%%)", s)
	case percent && (n < 1 || n > 100):
		return Max{}, fmt.Errorf("%q: a percentage must be between 1%% and 100%%", s)
	case !percent && n < 1:
		return Max{}, fmt.Errorf("%q: must be at least 1 (without --quarantine nothing is quarantined)", s)
	}
	return Max{N: n, Percent: percent}, nil
}

// Of is the most nodes quarantined at once among nodes: N, or P% of nodes rounded down;
// at least 1.
func (m Max) Of(nodes int) int {
	n := m.N
	if m.Percent {
		n = nodes * m.N / 100
	}
	return max(n, 1)
}

func (m Max) String() string {
	if m.Percent {
		return strconv.Itoa(m.N) + "%"
	}
	return strconv.Itoa(m.N)
}
