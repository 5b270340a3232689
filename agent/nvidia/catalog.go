package nvidia

import "slices"

// Blame says whose fault an Xid is: the GPU's, or the application's that
// used it.
type Blame string

const (
	// BlameApplication: the application's error (a bad address, an illegal
	// instruction, a context it left hung, or the cleanup after an earlier
	// error); the GPU is fine.
	BlameApplication Blame = "Application"
	// BlameDevice: the GPU failed (its memory, its bus, its NVLink, its
	// firmware), or may have; the application did nothing wrong.
	BlameDevice Blame = "Device"
)

// applicationXids are the Xids NVIDIA's k8s-device-plugin ignores when it
// decides whether a GPU is healthy, "Application errors: the GPU should
// still be healthy" (internal/rm/health.go, getDisabledHealthCheckXids, at
// 1b826acc, August 2026): 13, 31, 43, 45 and 68 since its first releases,
// 109 since v0.17.1 (CHANGELOG: "Ignore XID error 109").
var applicationXids = []int{13, 31, 43, 45, 68, 109}

// Classify says whether an Xid blames the device or the application. It
// follows NVIDIA's k8s-device-plugin, which marks a GPU unhealthy on every
// Xid but its ignore list: the Xids in applicationXids blame the
// application, every other, whether in the catalog below or not (an Xid
// number newer than this table included), blames the device.
//
// The plugin's choice is the one that takes the GPU out of service, so the
// Kubernetes view of a GPU and this verdict agree. NVIDIA's own catalog is
// finer (see Catalog): a few device Xids (63, 92, 94) need no reset, and 109
// asks for one although the plugin ignores it.
func Classify(code int) Blame {
	if slices.Contains(applicationXids, code) {
		return BlameApplication
	}
	return BlameDevice
}

// DeviceFault says whether x blames the GPU it names.
func (x Xid) DeviceFault() bool { return Classify(x.Code) == BlameDevice }

// CatalogEntry documents one notable Xid.
type CatalogEntry struct {
	Code int
	// Mnemonic is the driver's name for the Xid.
	Mnemonic string
	// Description says what happened, in a few words.
	Description string
	// ImmediateAction is the catalog's "Resolution Bucket (Immediate
	// Action)": RESTART_APP, RESET_GPU, RESTART_BM (reboot the machine),
	// IGNORE, or a WORKFLOW_* procedure of NVIDIA's.
	ImmediateAction string
	// Blame is Classify's verdict.
	Blame Blame
}

// catalog lists the Xids coroner has reason to name: the device plugin's
// ignore list and the notable hardware Xids. Sources:
//
//   - Mnemonic and ImmediateAction: NVIDIA's Xid catalog for Ampere and newer
//     GPUs, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
//     (columns "Mnemonic" and "Resolution Bucket (Immediate Action)"), read in
//     its machine-readable copy in NVIDIA's NVSentinel,
//     distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv
//     (the catalog page's own rows past Xid 13 were not reachable here).
//   - Description: the catalog's and the device plugin's wording, shortened;
//     48, 63 and 64 also from NVIDIA's "Dynamic Page Retirement" guide
//     (https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html:
//     48 a double-bit error, 63 a page retired, 64 a retirement that failed),
//     94 and 95 from the driver's comment on the reports it prints for them
//     (open-gpu-kernel-modules, _gpuGenerateErrorLog beside
//     gpuUpdateErrorContainmentState_GA100: "Contained: ... RST: No",
//     "Uncontained: ... RST: Yes").
//   - Blame: Classify, that is NVIDIA's k8s-device-plugin.
var catalog = []CatalogEntry{
	{13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "graphics engine exception (an illegal instruction or address in a kernel)", "RESTART_APP", BlameApplication},
	{31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (the application accessed an unmapped address)", "RESTART_APP", BlameApplication},
	{43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (the application's channel was reset)", "IGNORE", BlameApplication},
	{45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive cleanup of the channels after an earlier error, which has its own Xid", "WORKFLOW_XID_45", BlameApplication},
	{48, "ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit (uncorrectable) ECC error in GPU memory", "WORKFLOW_XID_48", BlameDevice},
	{62, "PMU_HALT_ERROR", "internal micro-controller halt", "RESET_GPU", BlameDevice},
	{63, "INFOROM_DRAM_RETIREMENT_EVENT", "ECC page retirement or row remapping recorded (takes effect at the next reset)", "IGNORE", BlameDevice},
	{64, "INFOROM_DRAM_RETIREMENT_FAILURE", "ECC page retirement or row remapping failed", "RESET_GPU", BlameDevice},
	{68, "ROBUST_CHANNEL_NVDEC0_ERROR", "video processor (NVDEC) exception", "RESTART_APP", BlameApplication},
	{74, "NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR", BlameDevice},
	{79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus (unreachable over PCIe)", "RESTART_BM", BlameDevice},
	{92, "EXCESSIVE_SBE_INTERRUPTS", "high single-bit (corrected) ECC error rate", "IGNORE", BlameDevice},
	{94, "ROBUST_CHANNEL_CONTAINED_ERROR", "contained uncorrectable memory error: the processes using the memory were stopped, the GPU goes on", "RESTART_APP", BlameDevice},
	{95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained uncorrectable memory error: every process on the GPU is affected", "RESET_GPU", BlameDevice},
	{109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", "RESET_GPU", BlameApplication},
	{119, "GSP_RPC_TIMEOUT", "timeout waiting for the GPU System Processor (GSP) firmware", "RESET_GPU", BlameDevice},
	{120, "GSP_ERROR", "error in the GPU System Processor (GSP) firmware", "RESET_GPU", BlameDevice},
	{140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "uncorrectable ECC error that escaped containment", "RESET_GPU", BlameDevice},
	{154, "GPU_RECOVERY_ACTION_CHANGED", "the GPU's recovery action changed (reset or reboot needed), after another Xid", "follow the other Xid's", BlameDevice},
}

// Catalog returns the notable Xids, by number. Xids not in it are still
// classified (see Classify).
func Catalog() []CatalogEntry { return slices.Clone(catalog) }

// Lookup returns the catalog entry of an Xid, ok false when it has none.
func Lookup(code int) (e CatalogEntry, ok bool) {
	i, found := slices.BinarySearchFunc(catalog, code, func(e CatalogEntry, c int) int { return e.Code - c })
	if !found {
		return CatalogEntry{}, false
	}
	return catalog[i], true
}
