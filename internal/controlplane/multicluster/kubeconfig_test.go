package multicluster

import (
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func kubeconfig(t *testing.T, edit func(c *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo)) []byte {
	t.Helper()
	k := clientcmdapi.NewConfig()
	c := &clientcmdapi.Cluster{Server: "https://192.0.2.1:6443", CertificateAuthorityData: []byte("ca")}
	a := &clientcmdapi.AuthInfo{Token: "tok"}
	if edit != nil {
		edit(c, a)
	}
	k.Clusters["west"], k.AuthInfos["west"] = c, a
	k.Contexts["west"] = &clientcmdapi.Context{Cluster: "west", AuthInfo: "west"}
	k.CurrentContext = "west"
	b, err := clientcmd.Write(*k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRESTConfigRefusesWhatRunsOrReads: a remote secret's kubeconfig may
// not make the control plane run a program or read its files (istiod's
// sanitizeKubeConfig); a bearer-token one, as istioctl writes, is fine.
func TestRESTConfigRefusesWhatRunsOrReads(t *testing.T) {
	rc, err := RESTConfig(kubeconfig(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://192.0.2.1:6443" || rc.BearerToken != "tok" {
		t.Fatalf("host %q token %q", rc.Host, rc.BearerToken)
	}
	for _, tc := range []struct {
		name string
		edit func(c *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo)
		want string
	}{
		{"exec", func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) {
			a.Exec = &clientcmdapi.ExecConfig{Command: "/bin/sh", APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: "Never"}
		}, "exec credentials are not allowed"},
		{"auth provider", func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) {
			a.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "gcp"}
		}, `auth provider "gcp" is not allowed`},
		{"token file", func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) { a.Token, a.TokenFile = "", "/etc/shadow" }, "tokenFile is not allowed"},
		{"client key file", func(_ *clientcmdapi.Cluster, a *clientcmdapi.AuthInfo) {
			a.ClientCertificateData, a.ClientKey = []byte("c"), "/etc/key"
		}, "client-key (a file) is not allowed"},
		{"CA file", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthorityData, c.CertificateAuthority = nil, "/etc/ca.pem"
		}, "certificate-authority (a file) is not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RESTConfig(kubeconfig(t, tc.edit))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := RESTConfig(nil); err == nil {
		t.Fatal("empty kubeconfig accepted")
	}
}
