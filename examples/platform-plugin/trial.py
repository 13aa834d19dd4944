import os

import nni

params = nni.get_next_parameter()
nni.report_intermediate_result(os.nice(0))  # the niceness the platform gave this trial
nni.report_final_result(params["x"])
