"""STAND-IN for Hugging Face `datasets`, for rlvr's tests only: the few `Dataset` methods the
stand-in `verifiers` package (../verifiers) and the test environments use, on a list of dicts.
Not the real package; scripts/check_verifiers_env.py runs the same environments with the real one.
"""


class Dataset:
    def __init__(self, rows):
        self._rows = [dict(r) for r in rows]

    @classmethod
    def from_list(cls, rows):
        return cls(rows)

    @property
    def column_names(self):
        names = []
        for r in self._rows:
            for k in r:
                if k not in names:
                    names.append(k)
        return names

    def map(self, fn, **kwargs):
        return Dataset([{**r, **fn(r)} for r in self._rows])

    def add_column(self, name, values):
        return Dataset([{**r, name: v} for r, v in zip(self._rows, values)])

    def remove_columns(self, names):
        return Dataset([{k: v for k, v in r.items() if k not in names} for r in self._rows])

    def rename_column(self, old, new):
        return Dataset([{(new if k == old else k): v for k, v in r.items()} for r in self._rows])

    def __len__(self):
        return len(self._rows)

    def __iter__(self):
        return iter([dict(r) for r in self._rows])

    def __getitem__(self, key):
        if isinstance(key, str):
            return [r.get(key) for r in self._rows]
        return dict(self._rows[key])
