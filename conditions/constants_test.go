package conditions

import "testing"

// TestVocabulary pins the values other components and users depend on: the
// upstream ones must match Kubernetes and Kueue byte for byte, coroner's own
// are API once released.
func TestVocabulary(t *testing.T) {
	cases := []struct {
		name string
		got  string
		want string
	}{
		{"DisruptionTarget", string(DisruptionTarget), "DisruptionTarget"},
		{"OOMKilled", string(OOMKilled), "coroner.dev/OOMKilled"},
		{"ForcefullyTerminated", string(ForcefullyTerminated), "coroner.dev/ForcefullyTerminated"},
		{"DeviceFailed", string(DeviceFailed), "coroner.dev/DeviceFailed"},

		{"ReasonPreemptionByScheduler", ReasonPreemptionByScheduler, "PreemptionByScheduler"},
		{"ReasonDeletionByTaintManager", ReasonDeletionByTaintManager, "DeletionByTaintManager"},
		{"ReasonEvictionByEvictionAPI", ReasonEvictionByEvictionAPI, "EvictionByEvictionAPI"},
		{"ReasonDeletionByPodGC", ReasonDeletionByPodGC, "DeletionByPodGC"},
		{"ReasonTerminationByKubelet", ReasonTerminationByKubelet, "TerminationByKubelet"},
		{"ReasonNodeOOMKill", ReasonNodeOOMKill, "NodeOOMKill"},
		{"ReasonDeviceFailure", ReasonDeviceFailure, "DeviceFailure"},
		{"ReasonMemoryLimitExceeded", ReasonMemoryLimitExceeded, "MemoryLimitExceeded"},

		{"AnnotationSafeToForcefullyDelete", AnnotationSafeToForcefullyDelete, "coroner.dev/safe-to-forcefully-delete"},
		{"AnnotationKueueSafeToForcefullyTerminate", AnnotationKueueSafeToForcefullyTerminate, "kueue.x-k8s.io/safe-to-forcefully-terminate"},
		{"AnnotationKueueSafeToForcefullyDelete", AnnotationKueueSafeToForcefullyDelete, "kueue.x-k8s.io/safe-to-forcefully-delete"},
		{"AnnotationExitHistory", AnnotationExitHistory, "coroner.dev/exit-history"},

		{"JobTrackingFinalizer", JobTrackingFinalizer, "batch.kubernetes.io/job-tracking"},
		{"JobIndexFailureCountAnnotation", JobIndexFailureCountAnnotation, "batch.kubernetes.io/job-index-failure-count"},
		{"JobIndexIgnoredFailureCountAnnotation", JobIndexIgnoredFailureCountAnnotation, "batch.kubernetes.io/job-index-ignored-failure-count"},
		{"JobCompletionIndexAnnotation", JobCompletionIndexAnnotation, "batch.kubernetes.io/job-completion-index"},
		{"JobCompletionIndexLabel", JobCompletionIndexLabel, "batch.kubernetes.io/job-completion-index"},
		{"ControllerUIDLabel", ControllerUIDLabel, "batch.kubernetes.io/controller-uid"},
		{"JobNameLabel", JobNameLabel, "batch.kubernetes.io/job-name"},
		{"ManagedBy", ManagedBy, "coroner.dev/shim"},
		{"ShimComponent", ShimComponent, "coroner-shim"},
		{"BuiltInJobControllerName", BuiltInJobControllerName, "kubernetes.io/job-controller"},

		{"JobReasonPodFailurePolicy", JobReasonPodFailurePolicy, "PodFailurePolicy"},
		{"JobReasonBackoffLimitExceeded", JobReasonBackoffLimitExceeded, "BackoffLimitExceeded"},
		{"JobReasonDeadlineExceeded", JobReasonDeadlineExceeded, "DeadlineExceeded"},
		{"JobReasonFailedIndexes", JobReasonFailedIndexes, "FailedIndexes"},
		{"JobReasonMaxFailedIndexesExceeded", JobReasonMaxFailedIndexesExceeded, "MaxFailedIndexesExceeded"},
		{"JobReasonSuccessPolicy", JobReasonSuccessPolicy, "SuccessPolicy"},
		{"JobReasonCompletionsReached", JobReasonCompletionsReached, "CompletionsReached"},
		{"JobReasonSuspended", JobReasonSuspended, "JobSuspended"},
		{"JobReasonResumed", JobReasonResumed, "JobResumed"},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

func TestOptedInToForcefulDeletion(t *testing.T) {
	cases := []struct {
		name        string
		annotations map[string]string
		want        bool
	}{
		{name: "no annotations"},
		{name: "coroner opt-in", annotations: map[string]string{AnnotationSafeToForcefullyDelete: "true"}, want: true},
		{name: "kueue terminate opt-in", annotations: map[string]string{AnnotationKueueSafeToForcefullyTerminate: "true"}, want: true},
		{name: "kueue delete opt-in", annotations: map[string]string{AnnotationKueueSafeToForcefullyDelete: "true"}, want: true},
		{name: "false is no opt-in", annotations: map[string]string{AnnotationSafeToForcefullyDelete: "false"}},
		{name: "only the exact value true counts", annotations: map[string]string{AnnotationSafeToForcefullyDelete: "True"}},
		{
			name: "any one true is enough",
			annotations: map[string]string{
				AnnotationSafeToForcefullyDelete:      "false",
				AnnotationKueueSafeToForcefullyDelete: "true",
			},
			want: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := OptedInToForcefulDeletion(tc.annotations); got != tc.want {
				t.Errorf("OptedInToForcefulDeletion(%v) = %v, want %v", tc.annotations, got, tc.want)
			}
		})
	}
}
