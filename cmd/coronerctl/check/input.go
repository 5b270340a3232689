package check

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// manifestExtensions are the files of a directory that are read, as with kubectl -f DIR
// (the extension's case counts, as there).
var manifestExtensions = []string{".yaml", ".yml", ".json"}

// expand turns the -f arguments into the files to read, in order: a file as given (any
// name), "-" for stdin, a directory as its manifests in lexical order (those of its
// subdirectories too when recursive). A name that cannot be read is a UsageError.
func expand(names []string, recursive bool) ([]string, error) {
	var files []string
	for _, name := range names {
		if name == "-" {
			files = append(files, name)
			continue
		}
		info, err := os.Stat(name)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		if !info.IsDir() {
			files = append(files, name)
			continue
		}
		err = filepath.WalkDir(name, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != name && !recursive {
					return filepath.SkipDir
				}
				return nil
			}
			if slices.Contains(manifestExtensions, filepath.Ext(path)) {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
	}
	return files, nil
}
