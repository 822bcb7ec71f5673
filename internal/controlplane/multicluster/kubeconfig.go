package multicluster

import (
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// RESTConfig turns a remote secret's kubeconfig into a REST configuration.
// The kubeconfig comes from whoever may write Secrets in the system
// namespace, so, as istiod's NewUntrustedRestConfig, it may not make this
// process run a program or read its files: exec credentials, auth
// providers other than oidc, and client certificate, key or token files
// and certificate-authority files are refused (their inline *Data forms
// are fine; istiod allows a CA file, we do not), and only the fields
// below are kept of each user.
func RESTConfig(kubeconfig []byte) (*rest.Config, error) {
	if len(kubeconfig) == 0 {
		return nil, errors.New("kubeconfig is empty")
	}
	raw, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig does not load: %w", err)
	}
	for name, c := range raw.Clusters {
		if c.CertificateAuthority != "" {
			return nil, fmt.Errorf("kubeconfig cluster %q: certificate-authority (a file) is not allowed; use certificate-authority-data", name)
		}
	}
	for name, a := range raw.AuthInfos {
		switch {
		case a.Exec != nil:
			return nil, fmt.Errorf("kubeconfig user %q: exec credentials are not allowed", name)
		case a.AuthProvider != nil && a.AuthProvider.Name != "oidc":
			return nil, fmt.Errorf("kubeconfig user %q: auth provider %q is not allowed (only oidc)", name, a.AuthProvider.Name)
		case a.ClientCertificate != "":
			return nil, fmt.Errorf("kubeconfig user %q: client-certificate (a file) is not allowed; use client-certificate-data", name)
		case a.ClientKey != "":
			return nil, fmt.Errorf("kubeconfig user %q: client-key (a file) is not allowed; use client-key-data", name)
		case a.TokenFile != "":
			return nil, fmt.Errorf("kubeconfig user %q: tokenFile is not allowed; use token", name)
		}
		raw.AuthInfos[name] = &clientcmdapi.AuthInfo{
			ClientCertificateData: a.ClientCertificateData,
			ClientKeyData:         a.ClientKeyData,
			Token:                 a.Token,
			Impersonate:           a.Impersonate,
			ImpersonateGroups:     a.ImpersonateGroups,
			ImpersonateUserExtra:  a.ImpersonateUserExtra,
			Username:              a.Username,
			Password:              a.Password,
			AuthProvider:          a.AuthProvider,
		}
	}
	// Validate only now: it opens the files a kubeconfig names.
	if err := clientcmd.Validate(*raw); err != nil {
		return nil, fmt.Errorf("kubeconfig is not valid: %w", err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return rc, nil
}
