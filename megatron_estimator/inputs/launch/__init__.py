"""Launch commands: from a command line or a launch script to the training script and its flags.

- ``command``: ``LaunchCommand`` (a launch taken apart).
- ``walk``: ``parse_launch_command``, walking wrappers and launchers to the training script;
  ``programs`` holds how each program spells its options, ``launchers`` the world size of
  torchrun, srun and mpirun.
- ``script``: ``load_launch_script``, the training launch of a bash script or sbatch file,
  read through the static shell reader ``inputs.bash`` (``sbatch``: its ``#SBATCH`` headers).
- ``shell_string``: the commands of a ``sh -c`` string, through the same reader.
- ``execute``: ``exec_launch``, running the launch unchanged.
"""
