// render: a small stand-in for `helm template`, for the chart's tests on machines without helm.
//
//	render -chart DIR [-f VALUES.yaml]... [-set a.b=c]... [-name RELEASE] [-namespace NS]
//
// Writes every rendered template of DIR/templates (files not starting with "_", NOTES.txt
// excluded unless -notes) as one multi-document YAML stream on stdout, each document preceded
// by "# Source: CHART/templates/FILE" as helm writes it.
//
// What it implements: Go's text/template with sprig's function map (as helm does), values
// from DIR/values.yaml merged deeply with each -f file and then each -set (a.b=c; c parsed as
// YAML scalar: true/false/numbers/null, else a string; no list indexes or escaped dots), the
// built-in objects .Values, .Release (Name, Namespace, Service, IsInstall, IsUpgrade,
// Revision), .Chart (the fields of Chart.yaml, capitalised as helm does: Name, Version,
// AppVersion, ...), .Capabilities (KubeVersion.Version/Major/Minor, APIVersions.Has answering
// true for monitoring.coreos.com/v1 only with -api), .Template (Name, BasePath), .Files.Get,
// and helm's functions include, tpl, required, fail, toYaml, fromYaml, toJson. Documents that
// render to whitespace only are dropped, as helm drops them.
//
// What it does not implement: lookup (always absent: the chart must not rely on it), subcharts
// and dependencies, hooks ordering (hook annotations are passed through as text), -set's list
// syntax, values.schema.json validation (the test does that separately), .Files.Glob/AsConfig/
// AsSecrets, toToml, and helm's post-render checks (the test deserializes every object
// with the Kubernetes models instead). Values are decoded with yaml.v3 (integers stay int)
// where helm goes through JSON (numbers become float64): the same text for the chart's
// values, but a template that tests a number's type would differ. toYaml is yaml.v3's with an
// indent of 2, not sigs.k8s.io/yaml's: the same objects, perhaps quoted differently.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func die(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "render: "+format+"\n", a...)
	os.Exit(1)
}

// normalize turns yaml.v3's map[string]interface{} trees (and any map[interface{}]) into
// map[string]interface{} all the way down, as helm's values are.
func normalize(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		for k, x := range t {
			t[k] = normalize(x)
		}
		return t
	case map[interface{}]interface{}:
		m := map[string]interface{}{}
		for k, x := range t {
			m[fmt.Sprint(k)] = normalize(x)
		}
		return m
	case []interface{}:
		for i, x := range t {
			t[i] = normalize(x)
		}
		return t
	}
	return v
}

// merge copies src into dst: maps merge key by key, anything else replaces (helm's coalesce;
// a null in src deletes the key, as in helm).
func merge(dst, src map[string]interface{}) {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			merge(dm, sm)
		} else {
			dst[k] = v
		}
	}
}

func readYAML(path string) map[string]interface{} {
	b, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		die("%s: %v", path, err)
	}
	return normalize(m).(map[string]interface{})
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

type files struct{ dir string }

func (f files) Get(name string) string {
	b, err := os.ReadFile(filepath.Join(f.dir, name))
	if err != nil {
		return ""
	}
	return string(b)
}

type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

func main() {
	var valueFiles, sets, apis multi
	chart := flag.String("chart", "", "chart directory")
	name := flag.String("name", "kprof", "release name")
	ns := flag.String("namespace", "default", "release namespace")
	notes := flag.Bool("notes", false, "render NOTES.txt only")
	flag.Var(&valueFiles, "f", "values file (repeatable)")
	flag.Var(&sets, "set", "a.b=c (repeatable)")
	flag.Var(&apis, "api", "API version the cluster serves, for .Capabilities.APIVersions.Has")
	flag.Parse()
	if *chart == "" {
		die("usage: render -chart DIR [-f VALUES]... [-set a.b=c]... [-name N] [-namespace NS]")
	}

	values := readYAML(filepath.Join(*chart, "values.yaml"))
	for _, f := range valueFiles {
		merge(values, readYAML(f))
	}
	for _, s := range sets {
		kv := strings.SplitN(s, "=", 2)
		if len(kv) != 2 {
			die("-set %q: want a.b=c", s)
		}
		var v interface{}
		if err := yaml.Unmarshal([]byte(kv[1]), &v); err != nil || kv[1] == "" {
			v = kv[1]
		}
		keys := strings.Split(kv[0], ".")
		m := map[string]interface{}{keys[len(keys)-1]: normalize(v)}
		for i := len(keys) - 2; i >= 0; i-- {
			m = map[string]interface{}{keys[i]: m}
		}
		merge(values, m)
	}

	meta := readYAML(filepath.Join(*chart, "Chart.yaml"))
	chartObj := map[string]interface{}{}
	for k, v := range meta {
		chartObj[strings.ToUpper(k[:1])+k[1:]] = v
	}
	chartName := fmt.Sprint(meta["name"])

	root := template.New("chart")
	var current string
	funcs := sprig.TxtFuncMap()
	funcs["include"] = func(n string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, n, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New(current + "/tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return nil, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	funcs["fail"] = func(msg string) (string, error) { return "", fmt.Errorf("%s", msg) }
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return normalize(m).(map[string]interface{})
	}
	funcs["toJson"] = func(v interface{}) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	funcs["lookup"] = func(...interface{}) map[string]interface{} { return map[string]interface{}{} }
	root.Funcs(funcs).Option("missingkey=zero")

	tdir := filepath.Join(*chart, "templates")
	entries, err := os.ReadDir(tdir)
	if err != nil {
		die("%v", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(tdir, e.Name()))
		if err != nil {
			die("%v", err)
		}
		n := chartName + "/templates/" + e.Name()
		if _, err := root.New(n).Parse(string(b)); err != nil {
			die("%v", err)
		}
		names = append(names, n)
	}
	sort.Strings(names)

	for _, n := range names {
		base := filepath.Base(n)
		isNotes := base == "NOTES.txt"
		if strings.HasPrefix(base, "_") || isNotes != *notes {
			continue
		}
		current = n
		data := map[string]interface{}{
			"Values": values,
			"Release": map[string]interface{}{"Name": *name, "Namespace": *ns, "Service": "Helm",
				"IsInstall": true, "IsUpgrade": false, "Revision": 1},
			"Chart": chartObj,
			"Capabilities": map[string]interface{}{
				"KubeVersion": map[string]interface{}{"Version": "v1.29.0", "Major": "1", "Minor": "29"},
				"APIVersions": apiVersions(apis),
			},
			"Template": map[string]interface{}{"Name": n, "BasePath": chartName + "/templates"},
			"Files":    files{*chart},
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, n, data); err != nil {
			die("%v", err)
		}
		out := strings.ReplaceAll(buf.String(), "<no value>", "")
		if isNotes {
			fmt.Print(out)
			continue
		}
		for _, doc := range strings.Split(out, "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			fmt.Printf("---\n# Source: %s\n%s\n", n, strings.Trim(doc, "\n"))
		}
	}
}
