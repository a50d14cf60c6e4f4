"""Analytics over archived cluster logs.

``log_decoder`` finds the log recordings of archive directories and decodes
their segment files into columns (numpy + Arrow, no Spark needed);
``spark_source`` is the PySpark data source ``fulmar-log`` built on it;
``analyze`` and ``replay`` are the Spark jobs behind ``cluster-tool analyze``
and ``cluster-tool replay``.  numpy, pyarrow and pyspark come with the
optional ``spark`` extra (``pip install fulmar[spark]``).
"""
