package agent

// The agent's own OOM score (oom_score_adj), so that a node OOM kills it last.

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// selfOOMScoreAdj is where the agent sets its own OOM score (a variable for tests).
var selfOOMScoreAdj = "/proc/self/oom_score_adj"

// setOOMScoreAdj writes v to the oom_score_adj file at path (/proc/<pid>/oom_score_adj)
// and returns the value it held before. The kernel's OOM killer weighs a task's memory
// by this score, from -1000 (never killed) to 1000. The runtime gives a container the
// score of its pod's QoS class (-997 for Guaranteed, the agent's class); -999, the
// kubelet's, leaves the agent to the last of a node OOM: the one process whose death
// would leave the kill it reports unreported. Lowering a score needs CAP_SYS_RESOURCE.
func setOOMScoreAdj(path string, v int) (before int, err error) {
	old, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read the OOM score: %w", err)
	}
	before, err = strconv.Atoi(strings.TrimSpace(string(old)))
	if err != nil {
		return 0, fmt.Errorf("read the OOM score: %s holds %q", path, old)
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(v)), 0); err != nil {
		return before, fmt.Errorf("set the OOM score from %d to %d: %w", before, v, err)
	}
	return before, nil
}
