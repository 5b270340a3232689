package check

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/coroner-dev/coroner/shim/indexes"
)

// Limits of the v1.36 API server's Job validation (pkg/apis/batch/validation); the size
// limits of Indexed Jobs are shim/indexes' (CheckLimits).
const (
	maxPodFailurePolicyRules             = 20
	maxOnExitCodesValues                 = 255
	maxOnPodConditionsPatterns           = 20
	maxManagedByLength                   = 63
	maxSuccessPolicyRules                = 20
	maxSuccessPolicySucceededIndexesSize = 64 * 1024
)

var (
	supportedActions = []string{
		string(batchv1.PodFailurePolicyActionCount), string(batchv1.PodFailurePolicyActionFailIndex),
		string(batchv1.PodFailurePolicyActionFailJob), string(batchv1.PodFailurePolicyActionIgnore),
	}
	supportedOperators = []string{
		string(batchv1.PodFailurePolicyOnExitCodesOpIn), string(batchv1.PodFailurePolicyOnExitCodesOpNotIn),
	}
	supportedConditionStatuses = []string{
		string(corev1.ConditionFalse), string(corev1.ConditionTrue), string(corev1.ConditionUnknown),
	}
	supportedReplacementPolicies = []string{string(batchv1.Failed), string(batchv1.TerminatingOrFailed)}
)

// withDefaults returns a copy of spec with the defaults the API server applies before it
// validates a Job (SetDefaults_Job and SetDefaults_PodSpec of v1.36) that the rules below
// depend on.
func withDefaults(in *batchv1.JobSpec) *batchv1.JobSpec {
	spec := in.DeepCopy()
	if spec.Completions == nil && spec.Parallelism == nil {
		spec.Completions, spec.Parallelism = ptrTo[int32](1), ptrTo[int32](1)
	}
	if spec.Parallelism == nil {
		spec.Parallelism = ptrTo[int32](1)
	}
	if spec.BackoffLimit == nil {
		if spec.BackoffLimitPerIndex != nil {
			spec.BackoffLimit = ptrTo[int32](math.MaxInt32)
		} else {
			spec.BackoffLimit = ptrTo[int32](6)
		}
	}
	if spec.CompletionMode == nil {
		spec.CompletionMode = ptrTo(batchv1.NonIndexedCompletion)
	}
	if spec.PodReplacementPolicy == nil {
		if spec.PodFailurePolicy != nil {
			spec.PodReplacementPolicy = ptrTo(batchv1.Failed)
		} else {
			spec.PodReplacementPolicy = ptrTo(batchv1.TerminatingOrFailed)
		}
	}
	if spec.PodFailurePolicy != nil {
		for i := range spec.PodFailurePolicy.Rules {
			for j := range spec.PodFailurePolicy.Rules[i].OnPodConditions {
				if p := &spec.PodFailurePolicy.Rules[i].OnPodConditions[j]; p.Status == "" {
					p.Status = corev1.ConditionTrue
				}
			}
		}
	}
	if spec.Template.Spec.RestartPolicy == "" {
		spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	return spec
}

func ptrTo[T any](v T) *T { return &v }

// validateJobMeta is the API server's check of a Job's name: a DNS subdomain and, for an
// Indexed Job, short enough for the hostname of its last pod ("<name>-<completions-1>").
func validateJobMeta(meta *metav1.ObjectMeta, spec *batchv1.JobSpec) field.ErrorList {
	path := field.NewPath("metadata")
	var errs field.ErrorList
	switch {
	case meta.Name == "" && meta.GenerateName == "":
		errs = append(errs, field.Required(path.Child("name"), "name or generateName is required"))
	case meta.Name != "":
		for _, msg := range apivalidation.NameIsDNSSubdomain(meta.Name, false) {
			errs = append(errs, field.Invalid(path.Child("name"), meta.Name, msg))
		}
	default:
		for _, msg := range apivalidation.NameIsDNSSubdomain(meta.GenerateName, true) {
			errs = append(errs, field.Invalid(path.Child("generateName"), meta.GenerateName, msg))
		}
	}
	if meta.Name != "" && *spec.CompletionMode == batchv1.IndexedCompletion && spec.Completions != nil && *spec.Completions > 0 {
		last := fmt.Sprintf("%s-%d", meta.Name, *spec.Completions-1)
		if len(validation.IsDNS1123Label(last)) > 0 {
			errs = append(errs, field.Invalid(path.Child("name"), meta.Name,
				fmt.Sprintf("will not able to create pod with invalid DNS label: %s", last)))
		}
	}
	return errs
}

// validateJobSpec re-implements the API server's validation of the Job spec fields coroner
// cares about (ValidateJobSpec of v1.36: counts, completionMode, backoffLimitPerIndex,
// maxFailedIndexes, managedBy, podFailurePolicy, successPolicy, podReplacementPolicy,
// restartPolicy, a manual selector) on a defaulted spec, with the upstream messages and
// field paths. The pod template is checked only for what these rules need (its
// containers and their names); the size limits of Indexed Jobs come from
// indexes.CheckLimits.
func validateJobSpec(spec *batchv1.JobSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	nonNegative := func(v *int32, name string) {
		if v != nil {
			errs = append(errs, apivalidation.ValidateNonnegativeField(int64(*v), path.Child(name))...)
		}
	}
	nonNegative(spec.Parallelism, "parallelism")
	nonNegative(spec.Completions, "completions")
	if spec.ActiveDeadlineSeconds != nil {
		errs = append(errs, apivalidation.ValidateNonnegativeField(*spec.ActiveDeadlineSeconds, path.Child("activeDeadlineSeconds"))...)
	}
	nonNegative(spec.BackoffLimit, "backoffLimit")
	nonNegative(spec.TTLSecondsAfterFinished, "ttlSecondsAfterFinished")
	nonNegative(spec.BackoffLimitPerIndex, "backoffLimitPerIndex")
	if spec.MaxFailedIndexes != nil {
		nonNegative(spec.MaxFailedIndexes, "maxFailedIndexes")
		if spec.BackoffLimitPerIndex == nil {
			errs = append(errs, field.Required(path.Child("backoffLimitPerIndex"), "when maxFailedIndexes is specified"))
		}
	}
	if spec.ManagedBy != nil {
		errs = append(errs, validation.IsDomainPrefixedPath(path.Child("managedBy"), *spec.ManagedBy)...)
		if len(*spec.ManagedBy) > maxManagedByLength {
			errs = append(errs, field.TooLong(path.Child("managedBy"), "", maxManagedByLength))
		}
	}

	indexed := *spec.CompletionMode == batchv1.IndexedCompletion
	switch {
	case *spec.CompletionMode != batchv1.NonIndexedCompletion && !indexed:
		errs = append(errs, field.NotSupported(path.Child("completionMode"), *spec.CompletionMode,
			[]string{string(batchv1.NonIndexedCompletion), string(batchv1.IndexedCompletion)}))
	case indexed:
		if spec.Completions == nil {
			errs = append(errs, field.Required(path.Child("completions"), "when completion mode is Indexed"))
		}
		errs = append(errs, limitErrors(spec)...)
	default:
		if spec.BackoffLimitPerIndex != nil {
			errs = append(errs, field.Invalid(path.Child("backoffLimitPerIndex"), *spec.BackoffLimitPerIndex, "requires indexed completion mode"))
		}
		if spec.MaxFailedIndexes != nil {
			errs = append(errs, field.Invalid(path.Child("maxFailedIndexes"), *spec.MaxFailedIndexes, "requires indexed completion mode"))
		}
	}

	if spec.PodFailurePolicy != nil {
		errs = append(errs, validatePodFailurePolicy(spec, path.Child("podFailurePolicy"))...)
	}
	if spec.SuccessPolicy != nil {
		if !indexed {
			errs = append(errs, field.Invalid(path.Child("successPolicy"), field.OmitValueType{}, "requires indexed completion mode"))
		} else {
			errs = append(errs, validateSuccessPolicy(spec, path.Child("successPolicy"))...)
		}
	}
	errs = append(errs, validatePodReplacementPolicy(spec, path.Child("podReplacementPolicy"))...)
	errs = append(errs, validateTemplate(spec, path)...)
	return errs
}

// limitErrors turns indexes.CheckLimits' aggregate into its field errors, with the spec
// path of the Job (a CronJob's jobTemplate has another).
func limitErrors(spec *batchv1.JobSpec) field.ErrorList {
	err := indexes.CheckLimits(spec)
	if err == nil {
		return nil
	}
	var errs field.ErrorList
	agg, ok := err.(utilerrors.Aggregate)
	if !ok {
		return field.ErrorList{field.Invalid(field.NewPath("spec"), field.OmitValueType{}, err.Error())}
	}
	for _, e := range agg.Errors() {
		if fe, ok := e.(*field.Error); ok {
			errs = append(errs, fe)
		} else {
			errs = append(errs, field.Invalid(field.NewPath("spec"), field.OmitValueType{}, e.Error()))
		}
	}
	return errs
}

func validatePodFailurePolicy(spec *batchv1.JobSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	rulesPath := path.Child("rules")
	rules := spec.PodFailurePolicy.Rules
	if len(rules) > maxPodFailurePolicyRules {
		errs = append(errs, field.TooMany(rulesPath, len(rules), maxPodFailurePolicyRules))
	}
	names := containerNames(&spec.Template.Spec)
	for i := range rules {
		rule, rulePath := &rules[i], rulesPath.Index(i)
		actionPath := rulePath.Child("action")
		switch {
		case rule.Action == "":
			errs = append(errs, field.Required(actionPath, fmt.Sprintf("valid values: %q", supportedActions)))
		case rule.Action == batchv1.PodFailurePolicyActionFailIndex:
			if spec.BackoffLimitPerIndex == nil {
				errs = append(errs, field.Invalid(actionPath, rule.Action, "requires the backoffLimitPerIndex to be set"))
			}
		case !slices.Contains(supportedActions, string(rule.Action)):
			errs = append(errs, field.NotSupported(actionPath, rule.Action, supportedActions))
		}
		if rule.OnExitCodes != nil {
			errs = append(errs, validateOnExitCodes(rule.OnExitCodes, rulePath.Child("onExitCodes"), names)...)
		}
		if len(rule.OnPodConditions) > 0 {
			errs = append(errs, validateOnPodConditions(rule.OnPodConditions, rulePath.Child("onPodConditions"))...)
		}
		if rule.OnExitCodes != nil && len(rule.OnPodConditions) > 0 {
			errs = append(errs, field.Invalid(rulePath, field.OmitValueType{}, "specifying both OnExitCodes and OnPodConditions is not supported"))
		}
		if rule.OnExitCodes == nil && len(rule.OnPodConditions) == 0 {
			errs = append(errs, field.Invalid(rulePath, field.OmitValueType{}, "specifying one of OnExitCodes and OnPodConditions is required"))
		}
	}
	return errs
}

func containerNames(pod *corev1.PodSpec) map[string]bool {
	names := map[string]bool{}
	for _, c := range pod.Containers {
		names[c.Name] = true
	}
	for _, c := range pod.InitContainers {
		names[c.Name] = true
	}
	return names
}

func validateOnExitCodes(req *batchv1.PodFailurePolicyOnExitCodesRequirement, path *field.Path, names map[string]bool) field.ErrorList {
	var errs field.ErrorList
	opPath := path.Child("operator")
	switch {
	case req.Operator == "":
		errs = append(errs, field.Required(opPath, fmt.Sprintf("valid values: %q", supportedOperators)))
	case !slices.Contains(supportedOperators, string(req.Operator)):
		errs = append(errs, field.NotSupported(opPath, req.Operator, supportedOperators))
	}
	if req.ContainerName != nil && !names[*req.ContainerName] {
		errs = append(errs, field.Invalid(path.Child("containerName"), *req.ContainerName,
			"must be one of the container or initContainer names in the pod template"))
	}
	valuesPath := path.Child("values")
	switch {
	case len(req.Values) == 0:
		errs = append(errs, field.Invalid(valuesPath, req.Values, "at least one value is required"))
	case len(req.Values) > maxOnExitCodesValues:
		errs = append(errs, field.TooMany(valuesPath, len(req.Values), maxOnExitCodesValues))
	}
	seen := map[int32]bool{}
	ordered := true
	for j, v := range req.Values {
		if req.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn && v == 0 {
			errs = append(errs, field.Invalid(valuesPath.Index(j), v, "must not be 0 for the In operator"))
		}
		if seen[v] {
			errs = append(errs, field.Duplicate(valuesPath.Index(j), v))
		}
		seen[v] = true
		if j > 0 && req.Values[j-1] > v {
			ordered = false
		}
	}
	if !ordered {
		errs = append(errs, field.Invalid(valuesPath, req.Values, "must be ordered"))
	}
	return errs
}

func validateOnPodConditions(patterns []batchv1.PodFailurePolicyOnPodConditionsPattern, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(patterns) > maxOnPodConditionsPatterns {
		errs = append(errs, field.TooMany(path, len(patterns), maxOnPodConditionsPatterns))
	}
	for j, p := range patterns {
		pPath := path.Index(j)
		for _, msg := range content.IsLabelKey(string(p.Type)) {
			errs = append(errs, field.Invalid(pPath.Child("type"), p.Type, msg))
		}
		switch {
		case p.Status == "":
			errs = append(errs, field.Required(pPath.Child("status"), fmt.Sprintf("valid values: %q", supportedConditionStatuses)))
		case !slices.Contains(supportedConditionStatuses, string(p.Status)):
			errs = append(errs, field.NotSupported(pPath.Child("status"), p.Status, supportedConditionStatuses))
		}
	}
	return errs
}

func validateSuccessPolicy(spec *batchv1.JobSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	rulesPath := path.Child("rules")
	rules := spec.SuccessPolicy.Rules
	if len(rules) == 0 {
		errs = append(errs, field.Required(rulesPath, "at least one rules must be specified when the successPolicy is specified"))
	}
	if len(rules) > maxSuccessPolicyRules {
		errs = append(errs, field.TooMany(rulesPath, len(rules), maxSuccessPolicyRules))
	}
	var completions int32
	if spec.Completions != nil {
		completions = *spec.Completions
	}
	for i, rule := range rules {
		rulePath := rulesPath.Index(i)
		if rule.SucceededCount == nil && rule.SucceededIndexes == nil {
			errs = append(errs, field.Required(rulePath, "at least one of succeededCount or succeededIndexes must be specified"))
		}
		var total int32
		if rule.SucceededIndexes != nil {
			ixPath := rulePath.Child("succeededIndexes")
			if len(*rule.SucceededIndexes) > maxSuccessPolicySucceededIndexesSize {
				errs = append(errs, field.TooLong(ixPath, "", maxSuccessPolicySucceededIndexesSize))
			}
			var err error
			if total, err = countIndexes(*rule.SucceededIndexes, completions); err != nil {
				errs = append(errs, field.Invalid(ixPath, *rule.SucceededIndexes, "error parsing succeededIndexes: "+err.Error()))
			}
		}
		if rule.SucceededCount != nil {
			countPath := rulePath.Child("succeededCount")
			errs = append(errs, apivalidation.ValidateNonnegativeField(int64(*rule.SucceededCount), countPath)...)
			if *rule.SucceededCount > completions {
				errs = append(errs, field.Invalid(countPath, *rule.SucceededCount,
					fmt.Sprintf("must be less than or equal to %d (the number of specified completions)", completions)))
			}
			if rule.SucceededIndexes != nil && *rule.SucceededCount > total {
				errs = append(errs, field.Invalid(countPath, *rule.SucceededCount,
					fmt.Sprintf("must be less than or equal to %d (the number of indexes in the specified succeededIndexes field)", total)))
			}
		}
	}
	return errs
}

// countIndexes parses a successPolicy's succeededIndexes as the API server does
// (validateIndexesFormat: strconv.Atoi numbers, "a-b" with a < b, increasing, each below
// completions) and returns how many indexes it names.
func countIndexes(s string, completions int32) (int32, error) {
	if s == "" {
		return 0, nil
	}
	var total int32
	last := int32(-1)
	for _, part := range strings.Split(s, ",") {
		bounds := strings.Split(part, "-")
		if len(bounds) > 2 {
			return 0, fmt.Errorf("the fragment %q violates the requirement that an index interval can have at most two parts separated by '-'", part)
		}
		var ends [2]int32
		for k, b := range bounds {
			n, err := strconv.Atoi(b)
			if err != nil {
				return 0, fmt.Errorf("cannot convert string to integer for index: %q", b)
			}
			if n >= int(completions) {
				return 0, fmt.Errorf("too large index: %q", b)
			}
			ends[k] = int32(n)
		}
		if len(bounds) == 1 {
			ends[1] = ends[0]
		} else if ends[0] >= ends[1] {
			return 0, fmt.Errorf("non-increasing order, previous: %d, current: %d", ends[0], ends[1])
		}
		if last >= 0 && last >= ends[0] {
			return 0, fmt.Errorf("non-increasing order, previous: %d, current: %d", last, ends[0])
		}
		total += ends[1] - ends[0] + 1
		last = ends[1]
	}
	return total, nil
}

func validatePodReplacementPolicy(spec *batchv1.JobSpec, path *field.Path) field.ErrorList {
	if spec.PodReplacementPolicy == nil {
		return nil
	}
	p := *spec.PodReplacementPolicy
	if spec.PodFailurePolicy != nil {
		if p != batchv1.Failed {
			return field.ErrorList{field.NotSupported(path, p, []string{string(batchv1.Failed)})}
		}
		return nil
	}
	if !slices.Contains(supportedReplacementPolicies, string(p)) {
		return field.ErrorList{field.NotSupported(path, p, supportedReplacementPolicies)}
	}
	return nil
}

// validateTemplate checks the parts of the pod template the Job rules depend on: the
// restart policy, at least one container, unique DNS-label container names, and that a
// manual selector selects the template.
func validateTemplate(spec *batchv1.JobSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	podPath := path.Child("template", "spec")
	pod := &spec.Template.Spec
	if len(pod.Containers) == 0 {
		errs = append(errs, field.Required(podPath.Child("containers"), ""))
	}
	seen := map[string]bool{}
	for _, list := range []struct {
		name       string
		containers []corev1.Container
	}{{"initContainers", pod.InitContainers}, {"containers", pod.Containers}} {
		for i, c := range list.containers {
			namePath := podPath.Child(list.name).Index(i).Child("name")
			if c.Name == "" {
				errs = append(errs, field.Required(namePath, ""))
				continue
			}
			for _, msg := range validation.IsDNS1123Label(c.Name) {
				errs = append(errs, field.Invalid(namePath, c.Name, msg))
			}
			if seen[c.Name] {
				errs = append(errs, field.Duplicate(namePath, c.Name))
			}
			seen[c.Name] = true
		}
	}

	rpPath := podPath.Child("restartPolicy")
	switch rp := pod.RestartPolicy; {
	case rp == corev1.RestartPolicyAlways:
		errs = append(errs, field.Required(rpPath, fmt.Sprintf("valid values: %q, %q", corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever)))
	case rp != corev1.RestartPolicyOnFailure && rp != corev1.RestartPolicyNever:
		errs = append(errs, field.NotSupported(rpPath, rp, []string{string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever)}))
	case spec.PodFailurePolicy != nil && rp != corev1.RestartPolicyNever:
		errs = append(errs, field.Invalid(rpPath, rp, fmt.Sprintf("only %q is supported when podFailurePolicy is specified", corev1.RestartPolicyNever)))
	}

	if spec.ManualSelector != nil && *spec.ManualSelector {
		if spec.Selector == nil {
			errs = append(errs, field.Required(path.Child("selector"), ""))
		} else if sel, err := metav1.LabelSelectorAsSelector(spec.Selector); err != nil {
			errs = append(errs, field.Invalid(path.Child("selector"), field.OmitValueType{}, err.Error()))
		} else if !sel.Matches(labels.Set(spec.Template.Labels)) {
			errs = append(errs, field.Invalid(path.Child("template", "metadata", "labels"), spec.Template.Labels, "`selector` does not match template `labels`"))
		}
	}
	return errs
}
