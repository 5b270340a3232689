package harness

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestSharedEnvServesV1363 checks that the shared API server is the one we built, that it
// stores objects, and that the kubeconfig file works as well as the rest.Config.
func TestSharedEnvServesV1363(t *testing.T) {
	env := Shared(t)
	t.Logf("kube-apiserver %s at %s, started in %v", env.ServerVersion, env.Config.Host, env.StartupTime)
	if env.ServerVersion != KubeVersion {
		t.Fatalf("server version = %q, want %q", env.ServerVersion, KubeVersion)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
	if err != nil {
		t.Fatalf("loading kubeconfig: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ns := env.Namespace(t)
	got, err := client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading back namespace through the kubeconfig: %v", err)
	}
	if got.Status.Phase != "Active" {
		t.Errorf("namespace phase = %q, want Active", got.Status.Phase)
	}
}

// TestStopLeavesNothingBehind starts a second, private Env and checks that Stop ends every
// process it started and removes its working directory.
func TestStopLeavesNothingBehind(t *testing.T) {
	Shared(t) // skip or fail like the other tests when the binaries are missing
	env, err := Start(Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	pids := env.PIDs()
	if len(pids) != 2 {
		t.Fatalf("started %d processes, want 2 (etcd, kube-apiserver)", len(pids))
	}
	env.Stop()
	env.Stop() // idempotent
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after Stop (kill -0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(env.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("working directory %s still exists after Stop (stat: %v)", env.Dir, err)
	}
	if env.StartupTime > 30*time.Second {
		t.Errorf("start-up took %v; the harness must start in seconds", env.StartupTime)
	}
}

func TestNamespacePrefix(t *testing.T) {
	cases := map[string]string{
		"TestFoo":          "testfoo-",
		"TestFoo/sub_case": "testfoo-sub-case-",
		"TestAVeryLongNameThatGoesOnAndOnAndOnForeverMore": "testaverylongnamethatgoesonandonandonfor-",
	}
	for in, want := range cases {
		if got := namespacePrefix(in); got != want {
			t.Errorf("namespacePrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestControllerManagerRunsTheBuiltInJobController checks that the reference controller
// starts and syncs a Job that is not managed by coroner (it creates its pod).
func TestControllerManagerRunsTheBuiltInJobController(t *testing.T) {
	env := Shared(t)
	stop, err := env.StartControllerManager("job")
	if err != nil {
		t.Fatalf("StartControllerManager: %v", err)
	}
	defer stop()
	client := kubernetes.NewForConfigOrDie(env.Config)
	ns := env.Namespace(t)
	ctx := context.Background()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "ref", Namespace: ns},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "busybox:local"}},
		}}},
	}
	if _, err := client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 1 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("the built-in Job controller created no pod within 30s")
}
